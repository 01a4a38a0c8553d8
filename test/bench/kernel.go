package bench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"unsafe"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	gen "github.com/edgeproxy/edgeproxy/datapath/nfgen"
)

// Dest is a DNAT destination (an endpoint) packed as ip<<16 | port, so that
// a rule set of 100k endpoints is a cheap map.
type Dest uint64

// DestOf packs an endpoint.
func DestOf(ap netip.AddrPort) Dest {
	a := ap.Addr().As4()
	return Dest(uint64(binary.BigEndian.Uint32(a[:]))<<16 | uint64(ap.Port()))
}

// AddrPort unpacks d.
func (d Dest) AddrPort() netip.AddrPort {
	var a [4]byte
	binary.BigEndian.PutUint32(a[:], uint32(d>>16))
	return netip.AddrPortFrom(netip.AddrFrom4(a), uint16(d))
}

func (d Dest) String() string { return d.AddrPort().String() }

// Kernel reads the IPv4 DNAT destinations straight from the kernel (the
// nat table of x_tables; every table of nf_tables): the ground truth of
// what a proxy has programmed, whatever chains or maps it uses. It must be opened inside the node's network namespace (the
// socket stays bound to it).
type Kernel interface {
	// Generation changes whenever the table may have changed. x_tables
	// has no such counter, so for it every call returns a new value.
	Generation() (uint64, error)
	// Scan calls fn for every DNAT destination, once per rule or map
	// element that holds it.
	Scan(fn func(Dest)) error
	Close() error
}

// dnatDest decodes the data of an xtables DNAT target (revision 0, 1 or 2;
// the same bytes under x_tables and under nf_tables' compat layer).
func dnatDest(rev uint8, data []byte) (Dest, bool) {
	switch rev {
	case 0: // nf_nat_ipv4_multi_range_compat: rangesize, {flags, min_ip, max_ip, min, max}
		if len(data) < 20 {
			return 0, false
		}
		ip := binary.BigEndian.Uint32(data[8:12])
		port := binary.BigEndian.Uint16(data[16:18])
		return Dest(uint64(ip)<<16 | uint64(port)), true
	case 1, 2: // nf_nat_range{,2}: flags, min_addr[16], max_addr[16], min_proto, max_proto
		if len(data) < 40 {
			return 0, false
		}
		ip := binary.BigEndian.Uint32(data[4:8])
		port := binary.BigEndian.Uint16(data[36:38])
		return Dest(uint64(ip)<<16 | uint64(port)), true
	}
	return 0, false
}

// legacyKernel reads x_tables with IPT_SO_GET_INFO / IPT_SO_GET_ENTRIES,
// the calls iptables-legacy-save makes, without the formatting.
type legacyKernel struct {
	fd  int
	buf []byte
	gen uint64
}

const (
	iptSoGetInfo    = 64
	iptSoGetEntries = 65
	iptGetInfoSize  = 84 // name[32] valid_hooks hook_entry[5] underflow[5] num_entries size
	iptEntriesHdr   = 40 // name[32] size, padded to the entries' 8-byte alignment
	iptEntryTarget  = 88 // offsetof(struct ipt_entry, target_offset)
	xtTargetHdr     = 32 // target_size u16, name[29], revision u8
)

// OpenLegacy opens an x_tables reader in the calling thread's namespace.
func OpenLegacy() (Kernel, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return nil, fmt.Errorf("bench: x_tables socket: %w", err)
	}
	return &legacyKernel{fd: fd}, nil
}

func (k *legacyKernel) Generation() (uint64, error) { k.gen++; return k.gen, nil }

func (k *legacyKernel) getsockopt(opt int, buf []byte) error {
	n := uint32(len(buf))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(k.fd), unix.IPPROTO_IP, uintptr(opt),
		uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
	if e != 0 {
		return e
	}
	return nil
}

func (k *legacyKernel) Scan(fn func(Dest)) error {
	for attempt := 0; attempt < 5; attempt++ {
		info := make([]byte, iptGetInfoSize)
		copy(info, "nat")
		if err := k.getsockopt(iptSoGetInfo, info); err != nil {
			if errors.Is(err, unix.ENOENT) {
				return nil // no nat table yet: nothing programmed
			}
			return fmt.Errorf("bench: IPT_SO_GET_INFO nat: %w", err)
		}
		size := int(binary.NativeEndian.Uint32(info[80:84]))
		if cap(k.buf) < iptEntriesHdr+size {
			k.buf = make([]byte, iptEntriesHdr+size)
		}
		buf := k.buf[:iptEntriesHdr+size]
		clear(buf[:iptEntriesHdr])
		copy(buf, "nat")
		binary.NativeEndian.PutUint32(buf[32:36], uint32(size))
		if err := k.getsockopt(iptSoGetEntries, buf); err != nil {
			if errors.Is(err, unix.EAGAIN) {
				continue // replaced between the two calls
			}
			return fmt.Errorf("bench: IPT_SO_GET_ENTRIES nat: %w", err)
		}
		return scanEntries(buf[iptEntriesHdr:], fn)
	}
	return errors.New("bench: nat table kept changing under IPT_SO_GET_ENTRIES")
}

func scanEntries(b []byte, fn func(Dest)) error {
	for off := 0; off < len(b); {
		if len(b)-off < iptEntryTarget+4 {
			return fmt.Errorf("bench: truncated ipt_entry at %d", off)
		}
		e := b[off:]
		toff := int(binary.NativeEndian.Uint16(e[iptEntryTarget:]))
		next := int(binary.NativeEndian.Uint16(e[iptEntryTarget+2:]))
		if next <= 0 || toff+xtTargetHdr > next || off+next > len(b) {
			return fmt.Errorf("bench: bad ipt_entry offsets at %d", off)
		}
		t := e[toff:next]
		tsize := int(binary.NativeEndian.Uint16(t))
		if tsize >= xtTargetHdr && tsize <= len(t) && cstring(t[2:31]) == "DNAT" {
			if d, ok := dnatDest(t[31], t[xtTargetHdr:tsize]); ok {
				fn(d)
			}
		}
		off += next
	}
	return nil
}

func cstring(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

func (k *legacyKernel) Close() error { return unix.Close(k.fd) }

// nftKernel reads nf_tables over netlink: the ruleset generation (cheap),
// dumps of every rule, set and DNAT map element (nft.go), and the events
// the kernel sends for every committed transaction (see Watcher).
type nftKernel struct {
	c   *netlink.Conn
	mon *netlink.Conn // subscribed to NFNLGRP_NFTABLES
}

const nfnlSubsysNFTables = 10

// OpenNFT opens an nf_tables reader in the calling thread's namespace.
func OpenNFT() (Kernel, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, fmt.Errorf("bench: nf_tables netlink: %w", err)
	}
	const nfnlgrpNFTables = 7
	mon, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{Groups: 1 << (nfnlgrpNFTables - 1)})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("bench: nf_tables event socket: %w", err)
	}
	// A cold start commits hundreds of thousands of rules at once: a
	// large buffer (an overflow only costs a dump, see Watcher).
	if rc, err := mon.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 256<<20)
		})
	}
	return &nftKernel{c: c, mon: mon}, nil
}

func nfgen(family uint8) []byte { return []byte{family, 0, 0, 0} }

func (k *nftKernel) Generation() (uint64, error) {
	g, err := gen.Query(k.c)
	return uint64(g), err
}

// Scan reads every table of every family: DNATs in rules (xtables-compat
// targets and native nat expressions) and in DNAT maps.
func (k *nftKernel) Scan(fn func(Dest)) error {
	v := newNFTView(map[Dest]int{})
	if err := k.load(v); err != nil {
		return err
	}
	for d, n := range v.have {
		for range n {
			fn(d)
		}
	}
	return nil
}

func target(b []byte, fn func(Dest)) {
	var name string
	var rev uint32
	var info []byte
	_ = eachAttr(b, func(ad *netlink.AttributeDecoder) {
		switch ad.Type() {
		case nftaTargetName:
			name = ad.String()
		case nftaTargetRev:
			rev = ad.Uint32()
		case nftaTargetInfo:
			info = ad.Bytes()
		}
	})
	if name == "DNAT" {
		if d, ok := dnatDest(uint8(rev), info); ok {
			fn(d)
		}
	}
}

func (k *nftKernel) Close() error { k.mon.Close(); return k.c.Close() }

// receive blocks for the next messages from the event socket.
func (k *nftKernel) receive() ([]nftEvent, error) {
	msgs, err := k.mon.Receive()
	if err != nil {
		return nil, err
	}
	var out []nftEvent
	for _, m := range msgs {
		if m.Header.Type>>8 != nfnlSubsysNFTables {
			continue
		}
		ev, ok, err := parseNFT(int(m.Header.Type&0xff), m.Data)
		if err != nil {
			return nil, err
		}
		if !ok {
			// Says nothing about destinations (a chain, a table), but
			// it is part of what the transaction wrote.
			ev = nftEvent{kind: nftMsgOther}
		}
		ev.size = nlmsgAlign(nlmsgHdrLen + len(m.Data))
		out = append(out, ev)
	}
	return out, nil
}

// The netlink message header and alignment (linux/netlink.h).
const nlmsgHdrLen = 16

func nlmsgAlign(n int) int { return (n + 3) &^ 3 }
