package iptables

import (
	"fmt"
	"hash/fnv"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/nfgen"
	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// A fingerprint is a cheap summary of the kernel's tables that changes
// when they are written: nf_tables' ruleset generation (every committed
// transaction, in any table or family, bumps it), or for x_tables the size
// and rule count of the nat and filter tables (a removed, added or
// rewritten-to-another-size rule changes them). The tamper monitor reads it
// first and skips the checks, which run iptables, while it is unchanged:
// on a quiet node a check then costs a netlink call or two getsockopts
// instead of a dozen processes.

// xtablesInfo returns the size and rule count of each named x_tables
// table of fam (IPT_SO_GET_INFO / IP6T_SO_GET_INFO, which copy no rules).
// A table the kernel has not loaded yet counts as zero.
func xtablesInfo(fam datapath.Family, tables ...string) (uint64, error) {
	domain, level := unix.AF_INET, unix.IPPROTO_IP
	if fam == datapath.IPv6 {
		domain, level = unix.AF_INET6, unix.IPPROTO_IPV6
	}
	fd, err := unix.Socket(domain, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return 0, fmt.Errorf("iptables: x_tables socket: %w", err)
	}
	defer unix.Close(fd)
	const soGetInfo = 64 // IPT_SO_GET_INFO == IP6T_SO_GET_INFO
	h := fnv.New64a()
	for _, t := range tables {
		// struct ipt_getinfo: name[32] valid_hooks hook_entry[5] underflow[5] num_entries size
		var info [84]byte
		copy(info[:], t)
		n := uint32(len(info))
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), soGetInfo,
			uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&n)), 0)
		switch {
		case e == unix.ENOENT:
			clear(info[32:])
		case e != 0:
			return 0, fmt.Errorf("iptables: get info of x_tables table %s: %w", t, e)
		}
		h.Write(info[:])
	}
	return h.Sum64(), nil
}

// fingerprint of this family's tables; ok is false when it cannot be read
// (then every check runs in full).
func (f *family) fingerprint() (uint64, bool) {
	if f.x.Variant == NFT {
		g, err := nfgen.Current()
		return uint64(g), err == nil
	}
	v, err := xtablesInfo(f.cfg.Family, xtables.NAT, xtables.Filter)
	return v, err == nil
}
