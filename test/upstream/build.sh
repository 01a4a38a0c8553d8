#!/bin/sh
# build.sh builds what the test/upstream tier runs besides the control plane
# of test/cluster/build.sh (etcd, kube-apiserver, kube-controller-manager,
# kube-proxy, which it builds first):
#
#   bin/     kubelet, kubectl, kube-scheduler, agnhost, e2e.test (the
#            upstream e2e suite, go test -c k8s.io/kubernetes/test/e2e) and
#            ginkgo (runs it on parallel nodes), from
#            k8s.io/kubernetes v1.36.3 (build/go.mod); containerd v2, its
#            runc shim, ctr and CoreDNS with only the plugins the cluster
#            uses (runtime/go.mod); pause, from its C source in the same
#            Kubernetes module
#   images/  OCI archives for `ctr images import`, built without a registry
#            (image.sh): registry.k8s.io/e2e-test-images/agnhost:2.63.0 (a
#            Debian minbase root with curl, nc, iproute2, dig, iptables plus
#            agnhost), registry.k8s.io/pause:3.10.2,
#            registry.k8s.io/e2e-test-images/busybox:1.37.0-1 (Debian's
#            busybox-static), registry.k8s.io/kube-proxy:v1.36.3 and
#            edgeproxy.test/coredns:v1.15.0,
#            registry.k8s.io/e2e-test-images/regression-issue-74839:1.4 (the
#            server of the Conntrack invalid-state test, from
#            test/images/regression-issue-74839 of the same module, on the
#            Debian layer); base.tar is the Debian layer
#            that run.sh puts under bin/edgeproxy for edgeproxy's image
#
# runc and the CNI plugins are Debian's (runc, containernetworking-plugins),
# installed here when missing, as are debootstrap and a C compiler. Only Go,
# the Go module proxy and Debian's archive are needed.
#
# Everything goes to a cache outside git, beside test/cluster's binaries:
#
#   ${EDGEPROXY_CACHE:-$HOME/.cache/edgeproxy}/k8s-v1.36.3/upstream/
#
# and the build is skipped when its stamp (a hash of the files it is built
# from) matches. It prints the directory on success. EDGEPROXY_BUILD_FORCE=1
# rebuilds regardless of the stamp.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
k8s_version=v1.36.3
cache=${EDGEPROXY_CACHE:-${HOME:?HOME or EDGEPROXY_CACHE must be set}/.cache/edgeproxy}
out="$cache/k8s-$k8s_version/upstream"
bins="kubelet kubectl kube-scheduler agnhost e2e.test ginkgo containerd containerd-shim-runc-v2 ctr coredns pause"
images="agnhost pause busybox kube-proxy coredns regression-issue-74839 base"
debs="runc containernetworking-plugins debootstrap gcc libc6-dev busybox-static iptables conntrack util-linux"
debian_suite=bookworm
debian_mirror=${EDGEPROXY_DEBIAN_MIRROR:-http://deb.debian.org/debian}

log() { echo "build.sh: $*" >&2; }
die() {
	log "$*"
	exit 1
}

# The control plane and kube-proxy come first: kube-proxy's image needs it.
cluster_bin=$("$here/../cluster/build.sh")

stamp=$(cat "$0" "$here/image.sh" "$here/build/go.mod" "$here/build/go.sum" \
	"$here/build/e2e.go" "$here/runtime/go.mod" "$here/runtime/go.sum" \
	"$here/runtime/coredns/main.go" "$cluster_bin/.stamp" | sha256sum | cut -d' ' -f1)

built_all() {
	for b in $bins; do
		[ -x "$out/bin/$b" ] || return 1
	done
	for i in $images; do
		[ -s "$out/images/$i.tar" ] || return 1
	done
}

missing_debs() {
	for p in $debs; do
		dpkg-query -W -f '${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || echo "$p"
	done
}

if [ "${EDGEPROXY_BUILD_FORCE:-0}" != 1 ] && [ -f "$out/.stamp" ] &&
	[ "$(cat "$out/.stamp")" = "$stamp" ] && built_all && [ -z "$(missing_debs)" ]; then
	echo "$out"
	exit 0
fi

command -v go >/dev/null 2>&1 || die "go is not on PATH"
missing=$(missing_debs)
if [ -n "$missing" ]; then
	[ "$(id -u)" = 0 ] || die "Debian packages missing (install them as root): $missing"
	log "installing $missing"
	# shellcheck disable=SC2086 # one word per package
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing >&2 ||
		{ apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing >&2; } ||
		die "apt-get install $missing failed"
fi

mkdir -p "$cache"
work=$(mktemp -d "$cache/.upstream.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
mkdir -p "$work/bin" "$work/images"
start=$(date +%s)
step=$start
took() {
	now=$(date +%s)
	log "$1: $((now - step))s"
	step=$now
}

# The version the Kubernetes binaries report; without it v0.0.0-master,
# which kubelet's and the e2e suite's version checks refuse.
v=k8s.io/component-base/version
ldflags="-s -w -X $v.gitVersion=$k8s_version -X $v.gitMajor=1 -X $v.gitMinor=36 -X $v.gitTreeState=clean"
export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:-} -mod=readonly -buildvcs=false"

log "building kubelet kubectl kube-scheduler agnhost ginkgo ($k8s_version) into $out/bin"
go -C "$here/build" build -trimpath -ldflags "$ldflags" -o "$work/bin/" \
	k8s.io/kubernetes/cmd/kubelet \
	k8s.io/kubernetes/cmd/kubectl \
	k8s.io/kubernetes/cmd/kube-scheduler \
	k8s.io/kubernetes/test/images/agnhost \
	github.com/onsi/ginkgo/v2/ginkgo
took "kubelet, kubectl, kube-scheduler, agnhost, ginkgo"

# Go, standard library only; the image's entrypoint.
mkdir -p "$work/l/regression-issue-74839"
go -C "$here/build" build -trimpath -ldflags "-s -w" -o "$work/l/regression-issue-74839/regression-issue-74839" \
	k8s.io/kubernetes/test/images/regression-issue-74839
took "regression-issue-74839"

log "building e2e.test ($k8s_version)"
go -C "$here/build" test -c -trimpath -ldflags "$ldflags" -o "$work/bin/e2e.test" \
	k8s.io/kubernetes/test/e2e
took "e2e.test"

log "building containerd, containerd-shim-runc-v2, ctr, coredns"
go -C "$here/runtime" build -trimpath -ldflags "-s -w" -o "$work/bin/" \
	github.com/containerd/containerd/v2/cmd/containerd \
	github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
	github.com/containerd/containerd/v2/cmd/ctr \
	./coredns
took "containerd, shim, ctr, coredns"

# pause is C (it reaps zombies as PID 1 of a pod); static, like upstream's.
kdir=$(go -C "$here/build" list -m -f '{{.Dir}}' k8s.io/kubernetes)
[ -n "$kdir" ] && [ -f "$kdir/build/pause/linux/pause.c" ] ||
	die "pause.c not found in the k8s.io/kubernetes module ($kdir)"
gcc -Os -Wall -Werror -static -DVERSION=v3.10.2-edgeproxy \
	-o "$work/bin/pause" "$kdir/build/pause/linux/pause.c"
strip "$work/bin/pause"
took "pause"

for b in $bins; do
	[ -x "$work/bin/$b" ] || die "$b was not built (got: $(ls "$work/bin"))"
done

# layer DIR OUT.tar: a reproducible layer of DIR's contents.
layer() {
	tar --sort=name --mtime=@0 --numeric-owner --owner=0 --group=0 \
		-C "$1" -cf "$2" .
}

# The Debian root of agnhost's image (and of kube-proxy's and edgeproxy's):
# what upstream's Alpine image has that the network tests call, plus the
# iptables tools the proxies run.
log "debootstrap $debian_suite (minbase) from $debian_mirror"
root="$work/root"
debootstrap --variant=minbase \
	--include=curl,wget,netcat-openbsd,iproute2,dnsutils,iputils-ping,procps,iptables,conntrack,ipset,kmod \
	"$debian_suite" "$root" "$debian_mirror" >"$work/debootstrap.log" 2>&1 ||
	{ tail -20 "$work/debootstrap.log" >&2; die "debootstrap failed"; }
rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"* \
	"$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/locale" "$root/var/log/"*
mkdir -p "$root/uploads"
layer "$root" "$work/images/base.tar"
took "debootstrap and base layer"

mkdir -p "$work/l/agnhost" "$work/l/pause" "$work/l/busybox/bin" "$work/l/coredns" "$work/l/kube-proxy/usr/local/bin"
cp "$work/bin/agnhost" "$work/l/agnhost/agnhost"
ln -s agnhost "$work/l/agnhost/agnhost-2"
cp "$work/bin/pause" "$work/l/pause/pause"
cp /bin/busybox "$work/l/busybox/bin/busybox"
for a in $(/bin/busybox --list); do
	[ "$a" = busybox ] || ln -s busybox "$work/l/busybox/bin/$a"
done
cp "$work/bin/coredns" "$work/l/coredns/coredns"
cp "$cluster_bin/kube-proxy" "$work/l/kube-proxy/usr/local/bin/kube-proxy"
for l in agnhost pause busybox coredns kube-proxy regression-issue-74839; do
	layer "$work/l/$l" "$work/l/$l.tar"
done

"$here/image.sh" "$work/images/agnhost.tar" registry.k8s.io/e2e-test-images/agnhost:2.63.0 \
	'["/agnhost"]' '["pause"]' "$work/images/base.tar" "$work/l/agnhost.tar"
"$here/image.sh" "$work/images/pause.tar" registry.k8s.io/pause:3.10.2 \
	'["/pause"]' null "$work/l/pause.tar"
"$here/image.sh" "$work/images/busybox.tar" registry.k8s.io/e2e-test-images/busybox:1.37.0-1 \
	null '["sh"]' "$work/l/busybox.tar"
"$here/image.sh" "$work/images/coredns.tar" edgeproxy.test/coredns:v1.15.0 \
	'["/coredns"]' null "$work/l/coredns.tar"
"$here/image.sh" "$work/images/kube-proxy.tar" registry.k8s.io/kube-proxy:$k8s_version \
	'["/usr/local/bin/kube-proxy"]' null "$work/images/base.tar" "$work/l/kube-proxy.tar"
"$here/image.sh" "$work/images/regression-issue-74839.tar" registry.k8s.io/e2e-test-images/regression-issue-74839:1.4 \
	'["/regression-issue-74839"]' null "$work/images/base.tar" "$work/l/regression-issue-74839.tar"
took "images"

rm -rf "$out"
mkdir -p "$out"
mv "$work/bin" "$work/images" "$out/"
echo "$stamp" >"$out/.stamp"
log "built in $(($(date +%s) - start))s"
echo "$out"
