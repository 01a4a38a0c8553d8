#!/bin/sh
# build.sh OUTDIR — builds every example policy module into OUTDIR/NAME.wasm
# (called by `make modules`): each directory under modules/ with a Go main
# package; each Rust module crate under modules/rust (with Debian's rustc
# and cargo, offline, named by path so that a rustup toolchain in PATH is
# not used) as OUTDIR/NAME-rust.wasm; each modules/c/NAME.c (clang for
# wasm32-wasi) as OUTDIR/NAME.wasm. The Rust and C modules need test/deps.sh's
# packages; without them they are left out, saying so.
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
if [ -x /usr/bin/cargo ] && [ -x /usr/bin/rustc ]; then
	target=${CARGO_TARGET_DIR:-$root/bin/rust-target}
	for d in modules/rust/*/; do
		d=${d%/}
		grep -q '"cdylib"' "$d/Cargo.toml" 2>/dev/null || continue
		name=$(basename "$d")
		echo "building rust/$name -> $out/$name-rust.wasm"
		(cd modules/rust && RUSTC=/usr/bin/rustc CARGO_TARGET_DIR="$target" \
			/usr/bin/cargo build --offline --release --locked --target wasm32-unknown-unknown -p "$name")
		cp "$target/wasm32-unknown-unknown/release/$(echo "$name" | tr - _).wasm" "$out/$name-rust.wasm"
	done
else
	echo "build.sh: /usr/bin/rustc or /usr/bin/cargo missing (test/deps.sh installs them); Rust modules not built" >&2
fi
if [ -x /usr/bin/clang ]; then
	for f in modules/c/*.c; do
		name=$(basename "$f" .c)
		echo "building c/$name -> $out/$name.wasm"
		(cd modules/c && /usr/bin/clang --target=wasm32-wasi -mexec-model=reactor -mbulk-memory -O2 -Wall -Wextra -Werror \
			-Wl,--strip-all -o "$out/$name.wasm" "$name.c")
	done
else
	echo "build.sh: /usr/bin/clang missing (test/deps.sh installs it); C modules not built" >&2
fi
