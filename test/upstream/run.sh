#!/bin/sh
# run.sh [smoke|suite] — the test/upstream tier (make e2e-upstream): builds
# what it needs (test/cluster/build.sh, build.sh, make build), then for each
# proxy in $PROXIES (default: kube-proxy, then edgeproxy) brings up a fresh
# one-node cluster (cluster.sh), installs the proxy as a user does, checks
# that a pod answers through a Service (smoke), and with "suite" (the
# default) runs upstream's [sig-network] Services e2e tests against it,
# keeping the JUnit. The cluster is taken down after each proxy, also on
# failure. It fails on any missing piece; nothing is skipped silently.
#
# Output: $EPUP_OUT (default /tmp/edgeproxy-upstream), one folder per proxy
# with the cluster's logs and the suite's JUnit and log.
#
# EPUP_EXTERNAL_IPS=true turns on edgeproxy's externalIPs in the
# DaemonSet's ConfigMap before it is applied, as a user would (the shipped
# config leaves them off: test/conformance/DIFFERENCES.md).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
what=${1:-suite}
PROXIES=${PROXIES:-kube-proxy edgeproxy}
out=${EPUP_OUT:-/tmp/edgeproxy-upstream}
NODE_IP=10.99.0.2

log() { echo "run.sh: $(date -u +%H:%M:%S) $*" >&2; }
die() {
	log "FAIL: $*"
	exit 1
}

case $what in smoke | suite) ;; *) die "usage: run.sh [smoke|suite]" ;; esac
[ "$(id -u)" = 0 ] || die "needs root (namespaces, cgroups, mounts, containers)"

t0=$(date +%s)
K8S_BIN=$("$repo/test/cluster/build.sh") || die "test/cluster/build.sh failed"
UPSTREAM=$("$here/build.sh") || die "test/upstream/build.sh failed"
make -C "$repo" build >&2 || die "make build failed"
export K8S_BIN UPSTREAM
log "built in $(($(date +%s) - t0))s"
mkdir -p "$out"
failed=""

# kc ARGS...: kubectl as admin, inside the node.
kc() { "$here/cluster.sh" exec "$dir" kubectl --kubeconfig="$dir/admin.kubeconfig" "$@"; }

# rollout KIND/NAME NAMESPACE SECONDS: waits for a rollout.
rollout() { kc -n "$2" rollout status "$1" --timeout="${3}s" >&2; }

install_kube_proxy() {
	sed "s/@API_SERVER@/$NODE_IP:6443/" "$here/manifests/kube-proxy.yaml" | kc apply -f - >&2
	rollout daemonset/kube-proxy kube-system 180
}

# install_edgeproxy: the way deploy/README.md tells users: an image with the
# binary at /usr/local/bin/edgeproxy and iptables, set in daemonset.yaml with
# the API server's address (KUBERNETES_SERVICE_HOST, _PORT 6443 as shipped),
# applied with rbac.yaml.
install_edgeproxy() {
	img=edgeproxy.test/edgeproxy:dev
	l=$(mktemp -d)
	mkdir -p "$l/root/usr/local/bin"
	cp "$repo/bin/edgeproxy" "$l/root/usr/local/bin/edgeproxy"
	tar --sort=name --mtime=@0 --numeric-owner --owner=0 --group=0 -C "$l/root" -cf "$l/layer.tar" .
	"$here/image.sh" "$l/edgeproxy.tar" "$img" null null "$UPSTREAM/images/base.tar" "$l/layer.tar"
	"$here/cluster.sh" exec "$dir" ctr --address "$dir/containerd.sock" -n k8s.io images import \
		--platform "linux/$(uname -m | sed 's/x86_64/amd64/;s/aarch64/arm64/')" "$l/edgeproxy.tar" >&2
	rm -rf "$l"
	kc apply -f "$repo/deploy/rbac.yaml" >&2
	extip=
	[ "${EPUP_EXTERNAL_IPS:-false}" = true ] && extip='/^    mode: iptables$/a\    externalIPs: true'
	sed -e "s#image: registry.example.com/edgeproxy:latest.*#image: $img#" \
		-e "s#value: api.example.com.*#value: \"$NODE_IP\"#" -e "$extip" "$repo/deploy/daemonset.yaml" >"$dir/edgeproxy.yaml"
	if [ -n "$extip" ]; then
		grep -q '^    externalIPs: true$' "$dir/edgeproxy.yaml" || die "could not set externalIPs: true in daemonset.yaml's ConfigMap"
	fi
	kc apply -f "$dir/edgeproxy.yaml" >&2
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

for proxy in $PROXIES; do
	dir=$out/$proxy
	if [ -d "$dir" ]; then
		"$here/cluster.sh" down "$dir" || true
		rm -rf "$dir"
	fi
	mkdir -p "$dir"
	trap '"$here/cluster.sh" down "$dir" || true' EXIT INT TERM
	t=$(date +%s)
	"$here/cluster.sh" up "$dir" || die "cluster up ($proxy) failed; logs in $dir/logs"
	log "cluster up in $(($(date +%s) - t))s"
	t=$(date +%s)
	case $proxy in
	kube-proxy) install_kube_proxy || die "kube-proxy did not roll out" ;;
	edgeproxy) install_edgeproxy || die "edgeproxy did not roll out" ;;
	*) die "unknown proxy $proxy" ;;
	esac
	kc apply -f "$here/manifests/coredns.yaml" >&2
	rollout deployment/coredns kube-system 180 || die "CoreDNS not ready ($proxy)"
	log "$proxy and CoreDNS ready in $(($(date +%s) - t))s"
	smoke
	if [ "$what" = suite ]; then
		t=$(date +%s)
		rc=0
		"$here/suite.sh" "$dir" || rc=$?
		log "suite ($proxy) exited $rc in $(($(date +%s) - t))s; JUnit: $dir/junit, log: $dir/logs/e2e.log"
		[ "$rc" = 0 ] || failed="$failed $proxy"
	fi
	"$here/cluster.sh" down "$dir"
	trap - EXIT INT TERM
done
if [ "$what" = suite ] && [ -f "$out/kube-proxy/junit/junit_01.xml" ] && [ -f "$out/edgeproxy/junit/junit_01.xml" ]; then
	go -C "$repo/test" run ./upstream/report \
		-kube-proxy "$out/kube-proxy/junit/junit_01.xml" \
		-edgeproxy "$out/edgeproxy/junit/junit_01.xml" >"$out/RESULTS.md" ||
		die "report failed"
	log "per-test results: $out/RESULTS.md"
fi
log "done in $(($(date +%s) - t0))s"
[ -z "$failed" ] || die "the suite failed with:$failed; per test: $out/RESULTS.md (a test that fails with kube-proxy too is a harness defect)"
