#!/bin/sh
# deps.sh [GROUP...] installs the Debian packages that the named groups need,
# when any is missing; with no group, every group (what make test needs). A
# target installs only its own groups, so `make demo` on a fresh machine does
# not wait for qemu, a kernel image or a Rust toolchain.
#
#   demo     make build and make demo: file (the static-binary check),
#            iptables (both backends) and iproute2
#   kernel   the kernel tiers: ipset, conntrack, nftables (datapath/nftables
#            lists its rules with nft), kmod, procps, gcc for -race
#   vm       the IPVS VM: qemu, Debian's kernel and busybox; ipvsadm and socat
#            inside it (the guest runs the host's root: they are installed
#            here, nothing is cached for them)
#   modules  the Rust and C policy modules: rustc, cargo, the wasm32 Rust std,
#            clang, lld, wasi-libc
#   package  checks of the packages and shell completions: systemd (unit
#            verification), lintian, rpm, zsh, fish
#   bench    the benchmark harness (test/bench): nftables, binutils
#
# As another user than root it only says what is missing (those tiers then
# skip and say why).
set -eu

group() {
	case $1 in
	demo) echo "file make ca-certificates iptables iproute2" ;;
	kernel) echo "ipset conntrack nftables kmod procps gcc libc6-dev" ;;
	vm) echo "qemu-system-x86 linux-image-amd64 busybox-static ipvsadm socat" ;;
	modules) echo "rustc cargo libstd-rust-dev-wasm32 clang lld wasi-libc libclang-rt-14-dev-wasm32" ;;
	package) echo "systemd lintian rpm zsh fish" ;;
	bench) echo "nftables binutils" ;;
	*)
		echo "deps.sh: unknown group $1 (demo, kernel, vm, modules, package, bench)" >&2
		exit 2
		;;
	esac
}

[ $# -gt 0 ] || set -- demo kernel vm modules package bench
pkgs=""
for g in "$@"; do
	pkgs="$pkgs $(group "$g")"
done
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
