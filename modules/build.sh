#!/bin/sh
# build.sh OUTDIR — builds every example policy module (each directory under
# modules/ with a main package) into OUTDIR/NAME.wasm. Called by `make modules`.
set -eu
out=${1:?usage: modules/build.sh OUTDIR}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$root"
for d in modules/*/; do
	d=${d%/}
	[ -f "$d/main.go" ] && grep -q '^package main$' "$d/main.go" || continue
	name=$(basename "$d")
	echo "building $name -> $out/$name.wasm"
	GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 go build -trimpath -buildmode=c-shared -o "$out/$name.wasm" "./$d"
done
