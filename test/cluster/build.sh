#!/bin/sh
# build.sh builds the upstream control-plane binaries that edgeproxy's
# real-API-server tests run — etcd, kube-apiserver, kube-controller-manager —
# and the kube-proxy used as the benchmark baseline, from the sources pinned in
# test/cluster/build/go.mod (k8s.io/kubernetes v1.36.3, etcd v3.6.8), fetched
# through the Go module proxy. It needs only Go.
#
# The binaries go to a cache outside git:
#
#   ${EDGEPROXY_CACHE:-$HOME/.cache/edgeproxy}/k8s-v1.36.3/bin/
#
# and the build is skipped when they are all there and the stamp (a hash of this
# script, go.mod and go.sum) matches. test/cluster finds them there, or in
# $EDGEPROXY_K8S_BIN when that is set. It prints the directory on success.
#
# A cold build takes several minutes on two cores; set EDGEPROXY_BUILD_FORCE=1
# to rebuild regardless of the stamp.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
mod="$here/build"
k8s_version=v1.36.3
cache=${EDGEPROXY_CACHE:-${HOME:?HOME or EDGEPROXY_CACHE must be set}/.cache/edgeproxy}
out="$cache/k8s-$k8s_version/bin"
bins="etcd kube-apiserver kube-controller-manager kube-proxy"

stamp=$(cat "$0" "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -d' ' -f1)

if [ "${EDGEPROXY_BUILD_FORCE:-0}" != 1 ] && [ -f "$out/.stamp" ] &&
	[ "$(cat "$out/.stamp")" = "$stamp" ]; then
	complete=1
	for b in $bins; do
		[ -x "$out/$b" ] || complete=0
	done
	if [ "$complete" = 1 ]; then
		echo "$out"
		exit 0
	fi
fi

command -v go >/dev/null 2>&1 || {
	echo "build.sh: go is not on PATH" >&2
	exit 1
}

mkdir -p "$cache"
work=$(mktemp -d "$cache/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM

# The version the binaries report (kube-apiserver's /version, kube-proxy
# --version); without it they say v0.0.0-master.
v=k8s.io/component-base/version
ldflags="-s -w -X $v.gitVersion=$k8s_version -X $v.gitMajor=1 -X $v.gitMinor=36 -X $v.gitTreeState=clean"

echo "build.sh: building $bins ($k8s_version) into $out" >&2
start=$(date +%s)
# One go build for all four lets the toolchain share and parallelise the work.
# -mod=readonly: go.sum is committed and must not change during a build.
CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly -buildvcs=false" \
	go -C "$mod" build -trimpath -ldflags "$ldflags" -o "$work/" \
	go.etcd.io/etcd/server/v3 \
	k8s.io/kubernetes/cmd/kube-apiserver \
	k8s.io/kubernetes/cmd/kube-controller-manager \
	k8s.io/kubernetes/cmd/kube-proxy

# go build names the etcd main package after its module path (…/server/v3).
for name in server v3; do
	if [ -f "$work/$name" ]; then
		mv "$work/$name" "$work/etcd"
	fi
done
for b in $bins; do
	[ -x "$work/$b" ] || {
		echo "build.sh: $b was not built (got: $(ls "$work"))" >&2
		exit 1
	}
done

mkdir -p "$out"
for b in $bins; do
	mv -f "$work/$b" "$out/$b"
done
echo "$stamp" >"$out/.stamp"
echo "build.sh: built in $(($(date +%s) - start))s" >&2
echo "$out"
