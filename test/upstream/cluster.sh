#!/bin/sh
# cluster.sh up DIR | down DIR | exec DIR CMD... — one real Kubernetes node
# for the test/upstream tier, on this machine, inside namespaces it makes:
#
#   network namespace  $NETNS (ip netns, $EPUP_NAME-node): the node. A veth "eth0" (its peer
#                      alone in $NETNS-void) holds the node address $NODE_IP
#                      and a default route that goes nowhere; the pod bridge cni0 ($POD_CIDR) is
#                      made by the bridge CNI plugin. Every process of the
#                      cluster runs here; nothing routes out.
#   mount namespace    DIR/run/mntns (unshare -m, private, then / rshared inside
#                      it): containerd's, kubelet's and runc's mounts stay
#                      in it. ip netns exec is not used: it remounts /sys
#                      and hides the cgroup mounts.
#   UTS namespace      DIR/run/utsns, host name the node's name (what
#                      hostNetwork Pods see).
#   cgroups            /epup (kubelet's cgroupRoot: the pods) and
#                      /epup-daemons (every process started here, and
#                      containerd's shims), in each cgroup v1 hierarchy.
#
# up starts etcd, kube-apiserver, kube-controller-manager (all controllers),
# kube-scheduler, containerd and kubelet, imports the images of build.sh into
# containerd, and waits until the node is Ready. No proxy runs: run.sh
# installs kube-proxy or edgeproxy as a DaemonSet. down stops and removes
# everything up made (processes, cgroups, mounts, namespaces, the global
# sysctls kubelet rewrites) and is safe to run after a failed up.
#
# EPUP_IPTABLES=legacy makes the node's iptables tools iptables-legacy
# (default nft, the machine's own).
#
# Binaries: $K8S_BIN (test/cluster/build.sh) and $UPSTREAM (build.sh).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
# EPUP_NAME names the namespaces and cgroups, so that two clusters (one
# per proxy) can run side by side; the addresses are the same in each.
NAME=${EPUP_NAME:-epup}
NETNS=$NAME-node
NODE=epup-node
NODE_IP=10.99.0.2
SERVICE_CIDR=10.96.0.0/16
SERVICE_IP=10.96.0.1
DNS_IP=10.96.0.10
POD_CIDR=10.244.0.0/24
CGROUP_PODS=$NAME
CGROUP_DAEMONS=$NAME-daemons
# EPUP_NODE_COUNT=2 adds a second node (phase 2): its own network
# namespace $NAME-node2 with address $NODE2_IP (a veth to the first node's
# "eth1"), its own mount namespace, containerd and kubelet under DIR/node2,
# cgroups /$NAME-n2 and /$NAME-n2-daemons, pods in $POD2_CIDR; each node
# routes the other's pod CIDR through it. The control plane stays on the
# first node.
NODE_COUNT=${EPUP_NODE_COUNT:-1}
NODE2=epup-node2
NODE2_IP=10.99.0.3
POD2_CIDR=10.244.1.0/24
CONTROLLERS="cpu cpuacct cpuset memory devices freezer blkio pids systemd"
# The kernel-wide sysctls kubelet sets at start (setupKernelTunables).
GLOBAL_SYSCTLS="kernel.panic kernel.panic_on_oops vm.overcommit_memory"
SYSCTLS_SAVED=/run/edgeproxy-upstream.sysctls

log() { echo "cluster.sh: $*" >&2; }
die() {
	log "$*"
	exit 1
}

[ $# -ge 2 ] || die "usage: cluster.sh up|down|exec DIR [CMD...]"
case $NODE_COUNT in 1 | 2) ;; *) die "EPUP_NODE_COUNT: 1 or 2, not $NODE_COUNT" ;; esac
verb=$1 dir=$2
shift 2

# use_node 1|2: the node the functions below work on: its state directory
# nd, network namespace nns, name, address, pod CIDR and cgroups.
use_node() {
	case $1 in
	1) nd=$dir nns=$NETNS node=$NODE node_ip=$NODE_IP pod_cidr=$POD_CIDR cg_pods=$CGROUP_PODS cg_daemons=$CGROUP_DAEMONS ;;
	2) nd=$dir/node2 nns=$NAME-node2 node=$NODE2 node_ip=$NODE2_IP pod_cidr=$POD2_CIDR cg_pods=$NAME-n2 cg_daemons=$NAME-n2-daemons ;;
	esac
}
use_node 1

# in CMD...: runs CMD in the node's network and mount namespaces.
node_exec() { nsenter --mount="$nd/run/mntns" --uts="$nd/run/utsns" --net="/run/netns/$nns" -- "$@"; }

# start NAME CMD...: starts CMD in the node, in cgroup /epup-daemons, with
# its output in DIR/logs/NAME.log and its PID in DIR/pids/NAME.
start() {
	name=$1
	shift
	# shellcheck disable=SC2016 # $$ is the inner shell's PID
	sh -c 'for c in '"$CONTROLLERS"'; do echo $$ >/sys/fs/cgroup/$c/'"$cg_daemons"'/cgroup.procs; done; exec "$@"' \
		sh nsenter --mount="$nd/run/mntns" --uts="$nd/run/utsns" --net="/run/netns/$nns" -- env PATH="$PATH" "$@" \
		>>"$nd/logs/$name.log" 2>&1 </dev/null &
	echo $! >"$nd/pids/$name"
}

# wait_for WHAT SECONDS CMD...: runs CMD every second until it succeeds;
# gives up at once when CMD returns 2 (what it waits for has died).
wait_for() {
	what=$1 secs=$2
	shift 2
	i=0
	while :; do
		rc=0
		"$@" >/dev/null 2>"$nd/logs/wait.err" || rc=$?
		[ "$rc" != 0 ] || break
		i=$((i + 1))
		if [ "$rc" = 2 ] || [ "$i" -ge "$secs" ]; then
			log "$what: not ready after ${i}s: $(tail -5 "$nd/logs/wait.err")"
			return 1
		fi
		sleep 1
	done
	log "$what: ready after ${i}s"
}

alive() { kill -0 "$(cat "$nd/pids/$1")" 2>/dev/null; }

# node_ready: kubelet runs and the Node says Ready.
node_ready() {
	alive kubelet || {
		echo "kubelet exited: $(tail -5 "$nd/logs/kubelet.log")" >&2
		return 2
	}
	node_exec kubectl --kubeconfig="$dir/admin.kubeconfig" get node "$node" \
		-o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' | grep -qx True
}

case $(uname -m) in
x86_64) ARCH=amd64 ;;
aarch64) ARCH=arm64 ;;
*) ARCH=$(uname -m) ;;
esac

kubeconfig() { # FILE USER CERT KEY [SERVER]
	cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: epup
  cluster:
    server: ${5:-https://$NODE_IP:6443}
    certificate-authority-data: $(base64 -w0 "$dir/pki/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 "$3")
    client-key-data: $(base64 -w0 "$4")
contexts:
- name: epup
  context: {cluster: epup, user: $2}
current-context: epup
EOF
}

up() {
	[ "$(id -u)" = 0 ] || die "needs root (namespaces, cgroups, mounts)"
	: "${K8S_BIN:?K8S_BIN: the directory test/cluster/build.sh prints}" "${UPSTREAM:?UPSTREAM: the directory build.sh prints}"
	[ ! -e "/run/netns/$NETNS" ] || die "/run/netns/$NETNS exists: a cluster is up (or was not cleaned: cluster.sh down DIR)"
	[ ! -e "/run/netns/$NAME-node2" ] || die "/run/netns/$NAME-node2 exists: a cluster is up (or was not cleaned: cluster.sh down DIR)"
	for c in $CONTROLLERS; do
		[ -d "/sys/fs/cgroup/$c" ] || die "cgroup v1 hierarchy /sys/fs/cgroup/$c missing"
		[ ! -d "/sys/fs/cgroup/$c/$CGROUP_PODS" ] || die "cgroup /sys/fs/cgroup/$c/$CGROUP_PODS exists: cluster.sh down first"
	done
	[ ! -e "$dir/etcd" ] || die "$dir holds an earlier cluster (etcd data): remove it first"
	mkdir -p "$dir/logs" "$dir/pids" "$dir/run"
	dir=$(cd "$dir" && pwd)
	use_node 1
	export PATH="$UPSTREAM/bin:$K8S_BIN:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

	# One saved copy for the machine: a second cluster started beside the
	# first would save what the first one's kubelet wrote.
	if [ ! -f "$SYSCTLS_SAVED" ]; then
		for s in $GLOBAL_SYSCTLS; do
			echo "$s=$(sysctl -n "$s")"
		done >"$SYSCTLS_SAVED.tmp"
		mv "$SYSCTLS_SAVED.tmp" "$SYSCTLS_SAVED"
	fi

	# This kernel has no dummy links ("Unknown device type"): eth0 is a veth
	# whose peer sits alone in $NETNS-void, which forwards nothing.
	ip netns add "$NETNS"
	ip netns add "$NETNS-void"
	ip -n "$NETNS" link set lo up
	ip -n "$NETNS" link add eth0 type veth peer name void netns "$NETNS-void"
	ip -n "$NETNS" addr add "$NODE_IP/24" dev eth0
	ip -n "$NETNS" link set eth0 up
	ip -n "$NETNS-void" link set void up
	# A route for every destination (Service addresses included, which the
	# proxies' OUTPUT rules rewrite after the lookup); what is left goes to
	# the void and is dropped there.
	ip -n "$NETNS" route add default dev eth0
	node_setup

	if [ "$NODE_COUNT" = 2 ]; then
		use_node 2
		mkdir -p "$nd/logs" "$nd/pids" "$nd/run"
		# The second node hangs off the first one's eth1: the first answers
		# for its own address there (ARP for any local address), and each
		# routes the other's pods through it. The second's default route
		# leads to the first, which drops what no proxy rewrote (its void).
		ip netns add "$nns"
		ip -n "$nns" link set lo up
		ip -n "$NETNS" link add eth1 type veth peer name eth0 netns "$nns"
		ip -n "$nns" addr add "$NODE2_IP/24" dev eth0
		ip -n "$nns" link set eth0 up
		ip -n "$NETNS" link set eth1 up
		ip -n "$NETNS" route add "$NODE2_IP/32" dev eth1
		ip -n "$NETNS" route add "$POD2_CIDR" via "$NODE2_IP" dev eth1
		ip -n "$nns" route add default via "$NODE_IP" dev eth0
		ip -n "$nns" route add "$POD_CIDR" via "$NODE_IP" dev eth0
		# Both forward between eth0/eth1 and their pods from the start (the
		# bridge plugin turns it on only with a node's first pod).
		nsenter --net="/run/netns/$NETNS" sysctl -qw net.ipv4.ip_forward=1
		nsenter --net="/run/netns/$nns" sysctl -qw net.ipv4.ip_forward=1
		node_setup
		use_node 1
	fi

	sh "$here/pki.sh" "$dir/pki" "$NODE_IP" "$SERVICE_IP" "$NODE" "$NODE2"
	p=$dir/pki
	kubeconfig "$dir/admin.kubeconfig" admin "$p/admin.crt" "$p/admin.key"
	kubeconfig "$dir/controller-manager.kubeconfig" system:kube-controller-manager "$p/controller-manager.crt" "$p/controller-manager.key"
	kubeconfig "$dir/scheduler.kubeconfig" system:kube-scheduler "$p/scheduler.crt" "$p/scheduler.key"
	kubeconfig "$dir/kubelet.kubeconfig" "system:node:$NODE" "$p/kubelet.crt" "$p/kubelet.key"

	start etcd etcd --name=epup --data-dir="$dir/etcd" \
		--listen-client-urls=http://127.0.0.1:2379 --advertise-client-urls=http://127.0.0.1:2379 \
		--listen-peer-urls=http://127.0.0.1:2380 --initial-advertise-peer-urls=http://127.0.0.1:2380 \
		--initial-cluster=epup=http://127.0.0.1:2380 --unsafe-no-fsync=true --log-level=warn
	wait_for etcd 60 node_exec curl -sf http://127.0.0.1:2379/health

	start kube-apiserver kube-apiserver --etcd-servers=http://127.0.0.1:2379 \
		--bind-address=0.0.0.0 --advertise-address="$NODE_IP" --secure-port=6443 \
		--service-cluster-ip-range="$SERVICE_CIDR" --allow-privileged=true \
		--authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
		--client-ca-file="$p/ca.crt" --tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" \
		--kubelet-client-certificate="$p/apiserver-kubelet-client.crt" --kubelet-client-key="$p/apiserver-kubelet-client.key" \
		--kubelet-preferred-address-types=InternalIP \
		--service-account-issuer=https://kubernetes.default.svc.cluster.local \
		--service-account-key-file="$p/sa.pub" --service-account-signing-key-file="$p/sa.key" \
		--cert-dir="$dir/apiserver-certs" --profiling=false --v=1
	wait_for kube-apiserver 180 node_exec kubectl --kubeconfig="$dir/admin.kubeconfig" get --raw /readyz

	start kube-controller-manager kube-controller-manager --kubeconfig="$dir/controller-manager.kubeconfig" \
		--authentication-kubeconfig="$dir/controller-manager.kubeconfig" --authorization-kubeconfig="$dir/controller-manager.kubeconfig" \
		--use-service-account-credentials=true --service-account-private-key-file="$p/sa.key" --root-ca-file="$p/ca.crt" \
		--cluster-signing-cert-file="$p/ca.crt" --cluster-signing-key-file="$p/ca.key" \
		--service-cluster-ip-range="$SERVICE_CIDR" --leader-elect=false --bind-address=127.0.0.1 \
		--cert-dir="$dir/controller-manager-certs" --profiling=false --v=1
	start kube-scheduler kube-scheduler --kubeconfig="$dir/scheduler.kubeconfig" \
		--authentication-kubeconfig="$dir/scheduler.kubeconfig" --authorization-kubeconfig="$dir/scheduler.kubeconfig" \
		--leader-elect=false --bind-address=127.0.0.1 --profiling=false --v=1

	node_up
	if [ "$NODE_COUNT" = 2 ]; then
		use_node 2
		kubeconfig "$nd/kubelet.kubeconfig" "system:node:$NODE2" "$p/kubelet-$NODE2.crt" "$p/kubelet-$NODE2.key"
		node_up
		use_node 1
	fi
}

# node_setup: the node's cgroups and mount namespace (and, with
# EPUP_IPTABLES=legacy, its iptables tools); its network namespace exists.
node_setup() {
	# kubelet wants its cgroupRoot in every hierarchy before it starts.
	for g in $cg_daemons $cg_pods; do
		for c in $CONTROLLERS; do
			mkdir -p "/sys/fs/cgroup/$c/$g"
		done
		# cpuset: a new cgroup starts with no CPUs and no memory nodes.
		cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset/$g/cpuset.cpus"
		cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset/$g/cpuset.mems"
	done

	# The mount namespace is pinned by a bind mount on a private mount.
	mount --bind "$nd/run" "$nd/run"
	mount --make-private "$nd/run"
	touch "$nd/run/mntns" "$nd/run/utsns"
	# Inside, /run is the node's own tmpfs (containerd's shim sockets at the
	# fixed /run/containerd/s, the pods' network namespaces, the xtables
	# lock) and /var/lib is DIR/var-lib (the CNI plugins' address leases in
	# /var/lib/cni, the proxies' hostPath state such as /var/lib/edgeproxy):
	# nothing of the node lands in the machine's own directories.
	mkdir -p "$nd/var-lib"
	# Its own UTS namespace too, with the node's name as host name: what a
	# hostNetwork Pod answers as its host name (the e2e tests expect the
	# node's name, not the machine's).
	unshare --mount="$nd/run/mntns" --uts="$nd/run/utsns" --propagation private sh -c \
		"hostname '$node' && mount --make-rshared / && mount -t tmpfs -o mode=0755 epup-run /run && mount --bind '$nd/var-lib' /var/lib"
	# EPUP_IPTABLES=legacy: the node's iptables tools (Debian's alternatives,
	# iptables-nft on this machine) are iptables-legacy inside the node, so
	# kubelet writes its chains (KUBE-IPTABLES-HINT, KUBE-FIREWALL) there.
	case ${EPUP_IPTABLES:-nft} in
	nft) ;;
	legacy)
		rm -rf "$nd/alternatives"
		cp -a /etc/alternatives "$nd/alternatives"
		for t in iptables ip6tables; do
			for s in "" -restore -save; do ln -sfn "/usr/sbin/$t-legacy$s" "$nd/alternatives/$t$s"; done
		done
		node_exec mount --bind "$nd/alternatives" /etc/alternatives
		node_exec iptables --version | grep -q legacy || die "the node's iptables is not iptables-legacy"
		;;
	*) die "EPUP_IPTABLES: nft or legacy, not ${EPUP_IPTABLES}" ;;
	esac
}

# node_up: the node's containerd (the images imported) and kubelet, until
# the Node is Ready.
node_up() {
	p=$dir/pki
	# containerd: its own root, state and socket under DIR; cgroupfs; the
	# sandbox image is the imported pause; CNI from Debian's plugins.
	mkdir -p "$nd/cni"
	cat >"$nd/cni/10-bridge.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "epup",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$pod_cidr"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
EOF
	cat >"$nd/containerd.toml" <<EOF
version = 3
root = "$nd/containerd/root"
state = "$nd/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs"]
[grpc]
  address = "$nd/containerd.sock"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "registry.k8s.io/pause:3.10.2"
[plugins.'io.containerd.cri.v1.runtime']
  # No CAP_SYS_RESOURCE here (CapEff lacks bit 24): runc cannot lower a
  # container's oom_score_adj below containerd's ("nsexec: failed to update
  # /proc/self/oom_score_adj: Permission denied"); clamp it instead.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = "$(command -v runc)"
      Root = "$nd/runc"
      SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$nd/cni"
EOF
	start containerd containerd --config "$nd/containerd.toml"
	wait_for containerd 60 node_exec ctr --address "$nd/containerd.sock" version
	for i in agnhost pause busybox kube-proxy coredns regression-issue-74839; do
		node_exec ctr --address "$nd/containerd.sock" -n k8s.io images import --platform "linux/$ARCH" \
			"$UPSTREAM/images/$i.tar" >>"$nd/logs/images.log" 2>&1 || die "import $i.tar failed: $(tail -3 "$nd/logs/images.log")"
	done
	log "images ($node): $(node_exec ctr --address "$nd/containerd.sock" -n k8s.io images ls -q | grep -v '^sha256:' | tr '\n' ' ')"

	cat >"$nd/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$cg_pods
containerRuntimeEndpoint: unix://$nd/containerd.sock
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $p/ca.crt}
authorization: {mode: Webhook}
clusterDomain: cluster.local
clusterDNS: [$DNS_IP]
resolvConf: ""
failSwapOn: false
podLogsDir: $nd/pod-logs
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi}
maxPods: 200
EOF
	start kubelet kubelet --config="$nd/kubelet.yaml" --kubeconfig="$nd/kubelet.kubeconfig" \
		--root-dir="$nd/kubelet" --cert-dir="$nd/kubelet-certs" \
		--hostname-override="$node" --node-ip="$node_ip" --v=1
	wait_for "node $node Ready" 240 node_ready ||
		die "the node did not get Ready; kubelet log: $(tail -20 "$nd/logs/kubelet.log")"
}

# cgroup_pids: every process in the node's cgroups.
cgroup_pids() {
	for g in $cg_pods $cg_daemons; do
		[ -d "/sys/fs/cgroup/pids/$g" ] && find "/sys/fs/cgroup/pids/$g" -name cgroup.procs -exec cat {} + 2>/dev/null
	done | sort -u
}

down() {
	[ -d "$dir" ] || die "$dir does not exist"
	dir=$(cd "$dir" && pwd)
	use_node 1
	export PATH="${UPSTREAM:+$UPSTREAM/bin:}${K8S_BIN:+$K8S_BIN:}$PATH"
	# The second node first (whether or not EPUP_NODE_COUNT says so), then
	# the first with the control plane.
	if [ -d "$dir/node2" ]; then
		use_node 2
		node_down
		use_node 1
	fi
	node_down
	[ ! -e "/run/netns/$NETNS-void" ] || ip netns del "$NETNS-void"
	# The last cluster down puts the machine's values back.
	others=""
	for n in /run/netns/*-node; do
		if [ -e "$n-void" ]; then others="$others ${n##*/}"; fi
	done
	if [ -f "$SYSCTLS_SAVED" ] && [ -z "$others" ]; then
		while IFS= read -r kv; do sysctl -q -w "$kv" >/dev/null; done <"$SYSCTLS_SAVED"
		rm -f "$SYSCTLS_SAVED"
	fi
	left=$(grep -c " $dir" /proc/mounts || true)
	[ "$left" = 0 ] || log "$left mounts under $dir left: $(grep " $dir" /proc/mounts | cut -d' ' -f2 | tr '\n' ' ')"
}

# node_down: stops and removes what up made for the node.
node_down() {
	# kubelet first, so that it restarts nothing; then the processes
	# started here, by PID, in reverse order of start.
	for n in kubelet containerd kube-scheduler kube-controller-manager kube-apiserver etcd; do
		[ -f "$nd/pids/$n" ] || continue
		pid=$(cat "$nd/pids/$n")
		if kill -TERM "$pid" 2>/dev/null; then
			i=0
			while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do
				sleep 0.1
				i=$((i + 1))
			done
			kill -KILL "$pid" 2>/dev/null || true
		fi
		rm -f "$nd/pids/$n"
	done
	# What is left in the node's cgroups: containers, their shims.
	for _ in 1 2 3 4 5 6 7 8 9 10; do
		pids=$(cgroup_pids)
		[ -n "$pids" ] || break
		# shellcheck disable=SC2086
		kill -KILL $pids 2>/dev/null || true
		sleep 0.5
	done
	[ -z "$(cgroup_pids)" ] || log "processes left in the cgroups: $(cgroup_pids)"
	# Every hierarchy: kubelet also makes its tree in the cgroup2 one
	# (/sys/fs/cgroup/unified).
	for h in /sys/fs/cgroup/*/; do
		for g in $cg_pods $cg_daemons; do
			[ -d "$h$g" ] || continue
			find "$h$g" -depth -type d -exec rmdir {} \; 2>/dev/null || true
			[ ! -d "$h$g" ] || log "cgroup $h$g not removed"
		done
	done
	# The mount namespace dies with its last process and its pin.
	for ns in mntns utsns; do
		if mountpoint -q "$nd/run/$ns" 2>/dev/null; then
			umount "$nd/run/$ns"
		fi
	done
	while mountpoint -q "$nd/run" 2>/dev/null; do umount "$nd/run"; done
	[ ! -e "/run/netns/$nns" ] || ip netns del "$nns"
}

case $verb in
up) up ;;
down) down ;;
exec)
	# EPUP_EXEC_NODE=2: in the second node.
	dir=$(cd "$dir" && pwd)
	use_node "${EPUP_EXEC_NODE:-1}"
	export PATH="${UPSTREAM:+$UPSTREAM/bin:}${K8S_BIN:+$K8S_BIN:}$PATH"
	node_exec "$@"
	;;
*) die "unknown verb $verb" ;;
esac
