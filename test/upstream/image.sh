#!/bin/sh
# image.sh writes a container image as an OCI image-layout archive that
# `ctr images import` reads, with no registry and no image builder:
#
#   image.sh OUT.tar NAME ENTRYPOINT_JSON CMD_JSON LAYER.tar...
#
# NAME is the full reference the image is imported as (for example
# registry.k8s.io/pause:3.10.2); ENTRYPOINT_JSON and CMD_JSON are JSON
# arrays or null. Each LAYER.tar is an uncompressed tar of a filesystem
# layer, applied in order. The image is linux/amd64 (or the host's
# architecture as Go names it): containerd matches images by platform and
# ignores one without it.
set -eu

[ $# -ge 5 ] || {
	echo "usage: image.sh OUT.tar NAME ENTRYPOINT_JSON CMD_JSON LAYER.tar..." >&2
	exit 2
}
out=$1 name=$2 entrypoint=$3 cmd=$4
shift 4

case $(uname -m) in
x86_64) arch=amd64 ;;
aarch64) arch=arm64 ;;
*) echo "image.sh: unsupported machine $(uname -m)" >&2; exit 1 ;;
esac

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT INT TERM
mkdir -p "$dir/blobs/sha256"

# blob FILE: moves FILE into the blob store; prints "DIGEST SIZE", which
# the callers split into $1 and $2 (set -- $(blob ...)).
blob() {
	d=$(sha256sum "$1" | cut -d' ' -f1)
	s=$(stat -c %s "$1")
	mv "$1" "$dir/blobs/sha256/$d"
	echo "$d $s"
}

layers="" diffids=""
for l in "$@"; do
	cp "$l" "$dir/layer"
	# shellcheck disable=SC2046
	set -- $(blob "$dir/layer")
	# Uncompressed layers: the digest is also the diff ID.
	layers="$layers${layers:+,}{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar\",\"digest\":\"sha256:$1\",\"size\":$2}"
	diffids="$diffids${diffids:+,}\"sha256:$1\""
done

printf '{"architecture":"%s","os":"linux","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Entrypoint":%s,"Cmd":%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":[%s]}}' \
	"$arch" "$entrypoint" "$cmd" "$diffids" >"$dir/config"
# shellcheck disable=SC2046
set -- $(blob "$dir/config")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[%s]}' \
	"$1" "$2" "$layers" >"$dir/manifest"
# shellcheck disable=SC2046
set -- $(blob "$dir/manifest")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"%s","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
	"$1" "$2" "$arch" "$name" "${name##*:}" >"$dir/index.json"
echo '{"imageLayoutVersion":"1.0.0"}' >"$dir/oci-layout"

tar -C "$dir" -cf "$out.tmp" oci-layout index.json blobs
mv -f "$out.tmp" "$out"
