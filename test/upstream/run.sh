#!/bin/sh
# run.sh [smoke|suite] — the test/upstream tier (make e2e-upstream): builds
# what it needs (test/cluster/build.sh, build.sh, make build), then for each
# proxy in $PROXIES (default: kube-proxy, then edgeproxy) brings up a fresh
# one-node cluster (cluster.sh), installs the proxy as a user does, checks
# that a pod answers through a Service (smoke), and with "suite" (the
# default) runs upstream's [sig-network] Services e2e tests against it,
# keeping the JUnit. The cluster is taken down after each proxy, also on
# failure. The proxy "switch" starts with kube-proxy and switches the node
# to edgeproxy under a stream of new connections before the suite (see
# switch() below). It fails on any missing piece; nothing is skipped silently.
#
# Output: $EPUP_OUT (default /tmp/edgeproxy-upstream), one folder per proxy
# with the cluster's logs and the suite's JUnit and log.
#
# EPUP_EXTERNAL_IPS=true turns on edgeproxy's externalIPs in the
# DaemonSet's ConfigMap before it is applied, as a user would (the shipped
# config leaves them off: test/conformance/DIFFERENCES.md).
# EPUP_IPTABLES=legacy makes the node (cluster.sh) and both proxies' images
# use iptables-legacy. EPUP_NODE_COUNT=2: two nodes (cluster.sh); images
# are loaded into both.
#
# EPUP_MODE=ipvs: both proxies in IPVS mode (kube-proxy's ConfigMap says
# mode: ipvs, edgeproxy's DaemonSet ConfigMap too, as users edit them).
# This machine's kernel has no IPVS, so after the build this script runs
# again inside the qemu VM (test/upstream/vmrun, internal/testkit/vm:
# Debian's kernel, the host's root read-only, $EPUP_OUT shared), with the
# clusters on the guest's tmpfs; EPUP_VM_MEMORY (MiB, default 6144),
# EPUP_VM_CPUS (default: the accelerator's) and EPUP_VM_TIMEOUT (default
# 4h) size it. RESULTS.md says how far that got.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
what=${1:-suite}
PROXIES=${PROXIES:-kube-proxy edgeproxy}
out=$(realpath -m "${EPUP_OUT:-/tmp/edgeproxy-upstream}") # absolute: go -C and the VM share it
NODE_IP=10.99.0.2
MODE=${EPUP_MODE:-iptables}
# Where the clusters live: $out, but in the VM the guest's tmpfs (overlayfs,
# containerd's snapshotter, cannot sit on the 9p share); each proxy's JUnit
# and logs are copied to $out afterwards.
work=$out
[ "${EDGEPROXY_IN_VM:-0}" != 1 ] || work=/var/tmp/epup

log() { echo "run.sh: $(date -u +%H:%M:%S) $*" >&2; }
die() {
	log "FAIL: $*"
	exit 1
}

case $what in smoke | suite) ;; *) die "usage: run.sh [smoke|suite]" ;; esac
case $MODE in iptables | ipvs) ;; *) die "EPUP_MODE: iptables or ipvs, not $MODE" ;; esac

# guest_setup: what the VM's init does not give and a node needs: the
# cgroup v1 hierarchies as this machine has them (cluster.sh and kubelet's
# cgroupfs driver use them), the cgroup2 one beside them, and devpts.
guest_setup() {
	mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup
	for c in cpu cpuacct cpuset memory devices freezer blkio pids; do
		mkdir "/sys/fs/cgroup/$c"
		mount -t cgroup -o "$c" cgroup "/sys/fs/cgroup/$c"
	done
	mkdir /sys/fs/cgroup/systemd /sys/fs/cgroup/unified
	mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd
	mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified
	mkdir -p /dev/pts
	mountpoint -q /dev/pts || mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts
	log "guest: $(nproc) vCPUs, $(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo) MiB, kernel $(uname -r)"
}

# report: the per-test table of both proxies' JUnit, when both ran.
report() {
	if [ "$what" = suite ] && [ -f "$out/kube-proxy/junit/junit_01.xml" ] && [ -f "$out/edgeproxy/junit/junit_01.xml" ]; then
		expect="$here/expected-differences"
		[ "${EPUP_EXTERNAL_IPS:-false}" != true ] || expect=""
		# Built, not "go run", which turns every exit code into 1: 1 is
		# the judgement, 2 a report that could not be made.
		go -C "$repo/test" build -o "$out/.report" ./upstream/report || die "report: build failed"
		judged=0
		"$out/.report" \
			-kube-proxy "$out/kube-proxy/junit/junit_01.xml" \
			-edgeproxy "$out/edgeproxy/junit/junit_01.xml" \
			-expect "$expect" >"$out/RESULTS.md" || judged=$?
		[ "$judged" != 2 ] || die "report failed"
		log "per-test results: $out/RESULTS.md"
		# Both ran: the judgement of the pair replaces the suites' exit
		# codes (edgeproxy's fails on its listed deliberate differences).
		if [ "$judged" = 0 ]; then
			failed=""
			log "every test that passes with kube-proxy passes with edgeproxy${expect:+, but those listed in $expect}"
		else
			failed=" (the judgement of both runs, above)"
		fi
	fi
}
[ "$(id -u)" = 0 ] || die "needs root (namespaces, cgroups, mounts, containers)"

t0=$(date +%s)
if [ "${EDGEPROXY_IN_VM:-0}" = 1 ]; then
	# In the VM (EPUP_MODE=ipvs, below): the host built everything, and
	# the guest sees it read-only where the host has it.
	: "${K8S_BIN:?K8S_BIN from the host}" "${UPSTREAM:?UPSTREAM from the host}"
	guest_setup
else
	K8S_BIN=$("$repo/test/cluster/build.sh") || die "test/cluster/build.sh failed"
	UPSTREAM=$("$here/build.sh") || die "test/upstream/build.sh failed"
	make -C "$repo" build >&2 || die "make build failed"
fi
export K8S_BIN UPSTREAM
log "built in $(($(date +%s) - t0))s"
if [ "$MODE" = ipvs ] && [ "${EDGEPROXY_IN_VM:-0}" != 1 ]; then
	# This kernel has no IPVS: the whole tier runs in the qemu VM
	# (internal/testkit/vm, Debian's kernel), this script again inside it,
	# with $out shared; then the report is made here.
	rc=0 failed=unjudged
	K8S_BIN=$K8S_BIN UPSTREAM=$UPSTREAM PROXIES=$PROXIES go -C "$repo/test" run ./upstream/vmrun \
		-dir "$out" -mem "${EPUP_VM_MEMORY:-6144}" -cpus "${EPUP_VM_CPUS:-0}" \
		-timeout "${EPUP_VM_TIMEOUT:-4h}" -- "$what" || rc=$?
	report
	log "done in $(($(date +%s) - t0))s (in the VM)"
	case $failed in
	"") ;; # both suites ran and the pair passed the judgement
	unjudged) [ "$rc" = 0 ] || die "run.sh in the VM failed ($rc); logs under $out" ;;
	*) die "the suites failed the judgement; per test: $out/RESULTS.md" ;;
	esac
	exit 0
fi
failed=""

# kc ARGS...: kubectl as admin, inside the node.
kc() { "$here/cluster.sh" exec "$dir" kubectl --kubeconfig="$dir/admin.kubeconfig" "$@"; }

# rollout KIND/NAME NAMESPACE SECONDS: waits for a rollout.
rollout() { kc -n "$2" rollout status "$1" --timeout="${3}s" >&2; }

install_kube_proxy() {
	if [ "${EPUP_IPTABLES:-nft}" = legacy ]; then
		# build.sh's image with the legacy layer on top, under the same name.
		l=$(mktemp -d)
		mkdir -p "$l/root/usr/local/bin"
		cp "$K8S_BIN/kube-proxy" "$l/root/usr/local/bin/kube-proxy"
		tar --sort=name --mtime=@0 --numeric-owner --owner=0 --group=0 -C "$l/root" -cf "$l/layer.tar" .
		"$here/image.sh" "$l/kube-proxy.tar" registry.k8s.io/kube-proxy:v1.36.3 '["/usr/local/bin/kube-proxy"]' null \
			"$UPSTREAM/images/base.tar" "$l/layer.tar" "$(alternatives_layer "$l/alt.tar")"
		import_image "$l/kube-proxy.tar"
		rm -rf "$l"
	fi
	# EPUP_MODE=ipvs: the ConfigMap's mode, as a kubeadm user sets it.
	sed -e "s/@API_SERVER@/$NODE_IP:6443/" -e "s/^    mode: iptables$/    mode: $MODE/" \
		"$here/manifests/kube-proxy.yaml" >"$dir/kube-proxy.yaml"
	grep -q "^    mode: $MODE$" "$dir/kube-proxy.yaml" || die "could not set mode: $MODE in kube-proxy.yaml's ConfigMap"
	kc apply -f "$dir/kube-proxy.yaml" >&2
	rollout daemonset/kube-proxy kube-system 180
}

# import_image TAR: imports an image archive into each node's containerd.
import_image() {
	for n in 1 2; do
		sock=$dir/containerd.sock
		if [ $n = 2 ]; then
			[ "${EPUP_NODE_COUNT:-1}" = 2 ] || break
			sock=$dir/node2/containerd.sock
		fi
		EPUP_EXEC_NODE=$n "$here/cluster.sh" exec "$dir" ctr --address "$sock" -n k8s.io images import \
			--platform "linux/$(uname -m | sed 's/x86_64/amd64/;s/aarch64/arm64/')" "$1" >&2
	done
}

# alternatives_layer OUT.tar: with EPUP_IPTABLES=legacy, a layer that points
# the image's iptables tools (Debian's alternatives, iptables-nft as built)
# at iptables-legacy, the backend cluster.sh gives the node then; without
# it, nothing (an empty argument list).
alternatives_layer() {
	[ "${EPUP_IPTABLES:-nft}" = legacy ] || return 0
	a=$(mktemp -d)
	mkdir -p "$a/etc/alternatives"
	for t in iptables ip6tables; do
		for s in "" -restore -save; do ln -s "/usr/sbin/$t-legacy$s" "$a/etc/alternatives/$t$s"; done
	done
	tar --sort=name --mtime=@0 --numeric-owner --owner=0 --group=0 -C "$a" -cf "$1" .
	rm -rf "$a"
	echo "$1"
}

# edgeproxy_image: the image a user builds: the binary at
# /usr/local/bin/edgeproxy on a Debian root with iptables, imported into
# the node's containerd (a user pushes it to a registry).
edgeproxy_image() {
	l=$(mktemp -d)
	mkdir -p "$l/root/usr/local/bin"
	cp "$repo/bin/edgeproxy" "$l/root/usr/local/bin/edgeproxy"
	tar --sort=name --mtime=@0 --numeric-owner --owner=0 --group=0 -C "$l/root" -cf "$l/layer.tar" .
	# shellcheck disable=SC2046 # an empty or one-word list
	"$here/image.sh" "$l/edgeproxy.tar" edgeproxy.test/edgeproxy:dev null null \
		"$UPSTREAM/images/base.tar" "$l/layer.tar" $(alternatives_layer "$l/alt.tar")
	import_image "$l/edgeproxy.tar"
	rm -rf "$l"
}

# edgeproxy_apply: the way deploy/README.md tells users: rbac.yaml and
# daemonset.yaml with the image and the API server's address
# (KUBERNETES_SERVICE_HOST, _PORT 6443 as shipped) set.
edgeproxy_apply() {
	kc apply -f "$repo/deploy/rbac.yaml" >&2
	extip=
	[ "${EPUP_EXTERNAL_IPS:-false}" = true ] && extip='/^    mode: iptables$/a\    externalIPs: true'
	# EPUP_MODE=ipvs: the ConfigMap's mode, as a user edits it.
	sed -e "s#image: registry.example.com/edgeproxy:latest.*#image: edgeproxy.test/edgeproxy:dev#" \
		-e "s#value: api.example.com.*#value: \"$NODE_IP\"#" -e "$extip" -e "s/^    mode: iptables$/    mode: $MODE/" \
		"$repo/deploy/daemonset.yaml" >"$dir/edgeproxy.yaml"
	grep -q "^    mode: $MODE$" "$dir/edgeproxy.yaml" || die "could not set mode: $MODE in daemonset.yaml's ConfigMap"
	if [ -n "$extip" ]; then
		grep -q '^    externalIPs: true$' "$dir/edgeproxy.yaml" || die "could not set externalIPs: true in daemonset.yaml's ConfigMap"
	fi
	kc apply -f "$dir/edgeproxy.yaml" >&2
}

install_edgeproxy() {
	edgeproxy_image
	edgeproxy_apply
	rollout daemonset/edgeproxy kube-system 180
}

# smoke: a Deployment of agnhost netexec behind a ClusterIP Service, asked
# from a pod through the Service's name (CoreDNS, through the proxy too).
smoke() {
	kc create namespace smoke >&2
	kc -n smoke create deployment web --image=registry.k8s.io/e2e-test-images/agnhost:2.63.0 \
		-- /agnhost netexec --http-port=8080 >&2
	kc -n smoke expose deployment web --port=80 --target-port=8080 >&2
	rollout deployment/web smoke 180
	kc -n smoke run client --image=registry.k8s.io/e2e-test-images/agnhost:2.63.0 --restart=Never \
		--command -- /agnhost pause >&2
	kc -n smoke wait --for=condition=Ready pod/client --timeout=120s >&2
	i=0
	until got=$(kc -n smoke exec client -- curl -sS --max-time 3 http://web.smoke.svc.cluster.local/hostname); do
		i=$((i + 1))
		[ $i -lt 30 ] || die "smoke ($proxy): no answer through Service web.smoke"
		sleep 2
	done
	log "smoke ($proxy): web.smoke answered from pod $got after $i retries"
	kc delete namespace smoke --wait=false >&2
}

# switch: the cluster runs kube-proxy (install_kube_proxy); while a client
# pod opens new connections to a Service through its ClusterIP and its
# NodePort (curl, 1 s timeout each, every 0.1 s; bounded by
# EPUP_SWITCH_SECONDS, default 150, and 1500 rounds), switches the node to
# edgeproxy the way deploy/README.md tells users with a DaemonSet: its
# image is loaded first, then `kubectl -n kube-system delete daemonset
# kube-proxy` and `kubectl apply` of rbac.yaml and daemonset.yaml at once.
# Writes DIR/switch/: events (UTC times), stream.log (one line per
# request: time, target, curl's exit status, HTTP status), rules-after
# (KUBE- lines left in either iptables backend) and summary.
switch() {
	sw=$dir/switch
	mkdir -p "$sw"
	secs=${EPUP_SWITCH_SECONDS:-150}
	ev() { echo "$(date -u +%s.%N) $*" >>"$sw/events"; log "switch: $*"; }
	kc create namespace switch >&2
	kc -n switch create deployment web --image=registry.k8s.io/e2e-test-images/agnhost:2.63.0 --replicas=2 \
		-- /agnhost netexec --http-port=8080 >&2
	kc -n switch expose deployment web --port=80 --target-port=8080 --type=NodePort >&2
	rollout deployment/web switch 180
	cip=$(kc -n switch get service web -o jsonpath='{.spec.clusterIP}')
	np=$(kc -n switch get service web -o jsonpath='{.spec.ports[0].nodePort}')
	edgeproxy_image
	# shellcheck disable=SC2016 # expanded in the pod
	kc -n switch run stream --image=registry.k8s.io/e2e-test-images/agnhost:2.63.0 --restart=Never \
		--env=CIP="$cip" --env=NP="$NODE_IP:$np" --env=SECS="$secs" --command -- bash -c '
		end=$(($(date +%s) + SECS)); i=0
		while [ $i -lt 1500 ] && [ "$(date +%s)" -lt $end ]; do
			for t in clusterip=$CIP nodeport=$NP; do
				at=$(date +%s.%N)
				code=$(curl -sS -o /dev/null -w "%{http_code}" --max-time 1 "http://${t#*=}/hostname" 2>/dev/null)
				echo "$at ${t%%=*} $? $code"
			done
			i=$((i + 1)); sleep 0.1
		done' >&2
	kc -n switch wait --for=condition=Ready pod/stream --timeout=120s >&2
	ev "stream started (ClusterIP $cip:80, NodePort $NODE_IP:$np)"
	sleep 15
	ev "kubectl -n kube-system delete daemonset kube-proxy"
	kc -n kube-system delete daemonset kube-proxy >&2
	ev "kubectl apply -f deploy/rbac.yaml -f deploy/daemonset.yaml"
	edgeproxy_apply
	rollout daemonset/edgeproxy kube-system 180 || die "edgeproxy did not roll out after the switch"
	ev "edgeproxy DaemonSet rolled out"
	i=0
	until kc -n kube-system logs daemonset/edgeproxy 2>/dev/null | grep -m1 'took over from kube-proxy' >"$sw/takeover"; do
		i=$((i + 1))
		[ $i -lt 60 ] || die "switch: edgeproxy never logged 'took over from kube-proxy'"
		sleep 1
	done
	ev "edgeproxy logged: $(cat "$sw/takeover")"
	i=0
	until [ "$(kc -n kube-system get pods -l k8s-app=kube-proxy -o name | wc -l)" = 0 ]; do
		i=$((i + 1))
		[ $i -lt 120 ] || die "switch: kube-proxy's Pod is still there"
		sleep 1
	done
	ev "kube-proxy's Pod gone"
	kc -n switch wait --for=jsonpath='{.status.phase}'=Succeeded pod/stream --timeout="$((secs + 60))s" >&2 ||
		die "switch: the stream pod did not finish"
	ev "stream finished"
	kc -n switch logs stream >"$sw/stream.log"
	# shellcheck disable=SC2016 # expanded in the node
	"$here/cluster.sh" exec "$dir" sh -c 'for b in nft legacy; do echo "# iptables-$b-save"; iptables-$b-save 2>/dev/null | grep KUBE- || true; done' >"$sw/rules-after"
	"$here/cluster.sh" exec "$dir" nft list tables >>"$sw/rules-after" 2>&1 || true
	t_del=$(grep ' kubectl -n kube-system delete' "$sw/events" | cut -d' ' -f1)
	{
		awk '{print "event +" sprintf("%.1f", $1 - t) "s:", substr($0, index($0, " ") + 1)}' t="$t_del" "$sw/events"
		awk -v t="$t_del" '
			{ n[$2]++; if ($3 != 0 || $4 != 200) { f[$2]++; s = int($1 - t + 1000) - 1000; fs[s]++; if (first == "" ) first = $1 - t; last = $1 - t } }
			END {
				for (k in n) printf "%s: %d requests, %d failed\n", k, n[k], f[k]
				if (first != "") printf "failures from +%.1fs to +%.1fs after the delete\n", first, last
				for (s = -30; s < 200; s++) if (fs[s]) printf "second %+d: %d failed\n", s, fs[s]
			}' "$sw/stream.log"
		echo "KUBE- lines left (either backend): $(grep -c '^[:-].*KUBE-' "$sw/rules-after" || true)"
		grep '^[:-].*KUBE-' "$sw/rules-after" || true
	} >"$sw/summary"
	log "switch summary:"
	cat "$sw/summary" >&2
	kc delete namespace switch --wait=false >&2
}

# keep: in the VM, the cluster's JUnit, logs and manifests into $out/$proxy
# (the share), after it is down.
keep() {
	[ "$work" != "$out" ] || return 0
	rm -rf "${out:?}/$proxy"
	mkdir -p "$out/$proxy"
	for f in junit logs switch kube-proxy.yaml edgeproxy.yaml; do
		[ ! -e "$dir/$f" ] || cp -r "$dir/$f" "$out/$proxy/"
	done
}

for proxy in $PROXIES; do
	dir=$work/$proxy
	if [ -d "$dir" ]; then
		"$here/cluster.sh" down "$dir" || true
		rm -rf "$dir"
	fi
	mkdir -p "$dir"
	trap '"$here/cluster.sh" down "$dir" || true; keep' EXIT
	trap '"$here/cluster.sh" down "$dir" || true; keep; exit 1' INT TERM
	t=$(date +%s)
	"$here/cluster.sh" up "$dir" || die "cluster up ($proxy) failed; logs in $dir/logs"
	log "cluster up in $(($(date +%s) - t))s"
	t=$(date +%s)
	case $proxy in
	kube-proxy | switch) install_kube_proxy || die "kube-proxy did not roll out" ;;
	edgeproxy) install_edgeproxy || die "edgeproxy did not roll out" ;;
	*) die "unknown proxy $proxy" ;;
	esac
	kc apply -f "$here/manifests/coredns.yaml" >&2
	rollout deployment/coredns kube-system 180 || die "CoreDNS not ready ($proxy)"
	log "$proxy and CoreDNS ready in $(($(date +%s) - t))s"
	smoke
	[ "$proxy" != switch ] || switch
	if [ "$what" = suite ]; then
		t=$(date +%s)
		rc=0
		"$here/suite.sh" "$dir" || rc=$?
		log "suite ($proxy) exited $rc in $(($(date +%s) - t))s; JUnit: $dir/junit, log: $dir/logs/e2e.log"
		[ "$rc" = 0 ] || failed="$failed $proxy"
	fi
	"$here/cluster.sh" down "$dir"
	keep
	trap - EXIT INT TERM
done
# In the VM, no Go: the host makes the report.
[ "${EDGEPROXY_IN_VM:-0}" = 1 ] || report
log "done in $(($(date +%s) - t0))s"
[ -z "$failed" ] || die "the suite failed with:$failed; per test: $out/RESULTS.md (a test that fails with kube-proxy too is a harness defect)"
