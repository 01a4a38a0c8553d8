#!/bin/sh
# deps.sh installs the Debian packages the test tiers need, when any is
# missing: iptables (nft and legacy), ipset, conntrack, iproute2 and kmod
# for the kernel tiers; qemu, Debian's kernel and busybox for the IPVS VM,
# ipvsadm and socat inside it (the guest runs the host's root: they are
# installed here, nothing is cached for them);
# systemd for unit verification; gcc for -race; nftables and binutils for
# the benchmark harness (test/bench); rustc, cargo, the wasm32 Rust std,
# clang, lld and wasi-libc for the Rust and C policy modules; lintian, rpm,
# zsh and fish to check the packages and shell completions (deploy/package).
# As another user than root
# it only says what is missing (those tiers then skip and say why).
set -eu
pkgs="iptables ipset conntrack iproute2 kmod procps file make gcc libc6-dev
qemu-system-x86 linux-image-amd64 busybox-static ipvsadm socat systemd ca-certificates
nftables binutils lintian rpm zsh fish
rustc cargo libstd-rust-dev-wasm32 clang lld wasi-libc libclang-rt-14-dev-wasm32"
missing=""
for p in $pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
	echo "deps.sh: missing Debian packages:$missing (install them as root; the tests that need them will skip)" >&2
	exit 0
fi
echo "deps.sh: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >/dev/null
