// Package ipset keeps named kernel ipsets equal to a wanted content over
// netlink (github.com/vishvananda/netlink; no `ipset` exec). Sets are
// created when missing, their entries are diffed (adds and deletes only,
// never a flush, so packets matched against a set never see it empty), and
// a set left with another type or family by an older version is replaced.
package ipset

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/edgeproxy/edgeproxy/datapath"
)

// Type is an ipset type as the kernel names it.
type Type string

// The set types the datapaths use.
const (
	HashIP        Type = "hash:ip"
	HashNet       Type = "hash:net"
	HashIPPort    Type = "hash:ip,port"
	HashIPPortIP  Type = "hash:ip,port,ip"
	HashIPPortNet Type = "hash:ip,port,net"
	BitmapPort    Type = "bitmap:port"
)

// MaxNameLen is the longest set name the kernel accepts (IPSET_MAXNAMELEN
// is 32 with the terminating NUL).
const MaxNameLen = 31

// Set describes a set: its name, type and family. Family is ignored for
// bitmap:port, which has none.
type Set struct {
	Name   string
	Type   Type
	Family datapath.Family
}

func (s Set) String() string {
	if s.Type == BitmapPort {
		return fmt.Sprintf("%s (%s)", s.Name, s.Type)
	}
	return fmt.Sprintf("%s (%s inet%s)", s.Name, s.Type, map[datapath.Family]string{datapath.IPv4: "", datapath.IPv6: "6"}[s.Family])
}

func (s Set) validate() error {
	if s.Name == "" || len(s.Name) > MaxNameLen {
		return fmt.Errorf("ipset: set name %q must have 1..%d characters", s.Name, MaxNameLen)
	}
	switch s.Type {
	case HashIP, HashNet, HashIPPort, HashIPPortIP, HashIPPortNet, BitmapPort:
	default:
		return fmt.Errorf("ipset: set %s: unsupported type %q", s.Name, s.Type)
	}
	if s.Type != BitmapPort && s.Family != datapath.IPv4 && s.Family != datapath.IPv6 {
		return fmt.Errorf("ipset: set %s: family %d", s.Name, s.Family)
	}
	return nil
}

// Entry is one member. Which fields count depends on the set's type:
// hash:ip uses Addr; hash:net uses Net; hash:ip,port uses Addr, Protocol
// and Port; hash:ip,port,ip adds Addr2; hash:ip,port,net adds Net;
// bitmap:port uses Port only. Entries are comparable, so they can be map
// keys.
type Entry struct {
	Addr     netip.Addr
	Protocol datapath.Protocol
	Port     uint16
	Addr2    netip.Addr
	Net      netip.Prefix
}

// String renders the entry in ipset's own syntax, e.g.
// "10.96.0.1,tcp:80,10.0.0.0/8".
func (e Entry) String() string {
	var parts []string
	if e.Addr.IsValid() {
		parts = append(parts, e.Addr.String())
	}
	if e.Port != 0 {
		if e.Protocol != "" {
			parts = append(parts, strings.ToLower(string(e.Protocol))+":"+strconv.Itoa(int(e.Port)))
		} else {
			parts = append(parts, strconv.Itoa(int(e.Port)))
		}
	}
	if e.Addr2.IsValid() {
		parts = append(parts, e.Addr2.String())
	}
	if e.Net.IsValid() {
		parts = append(parts, e.Net.String())
	}
	return strings.Join(parts, ",")
}

// normalize keeps only the fields the set's type stores, in the form the
// kernel reports them, so that wanted and listed entries compare equal.
func normalize(t Type, e Entry) (Entry, error) {
	var n Entry
	need := func(ok bool, what string) error {
		if !ok {
			return fmt.Errorf("ipset: entry %q for %s needs %s", e, t, what)
		}
		return nil
	}
	switch t {
	case HashIP:
		n.Addr = e.Addr.Unmap()
		return n, need(n.Addr.IsValid(), "an address")
	case HashNet:
		n.Net = e.Net.Masked()
		return n, need(n.Net.IsValid(), "a network")
	case BitmapPort:
		n.Port = e.Port
		return n, need(n.Port != 0, "a port")
	case HashIPPort, HashIPPortIP, HashIPPortNet:
		n.Addr, n.Protocol, n.Port = e.Addr.Unmap(), e.Protocol, e.Port
		if err := need(n.Addr.IsValid() && n.Port != 0 && n.Protocol.Number() != 0, "an address, protocol and port"); err != nil {
			return n, err
		}
		switch t {
		case HashIPPortIP:
			n.Addr2 = e.Addr2.Unmap()
			return n, need(n.Addr2.IsValid(), "a second address")
		case HashIPPortNet:
			n.Net = e.Net.Masked()
			return n, need(n.Net.IsValid(), "a network")
		}
	}
	return n, nil
}

// ErrInUse is wrapped when a set cannot be destroyed because a kernel
// component (an iptables rule) still refers to it.
var ErrInUse = errors.New("ipset: set is in use by a kernel component")

// Kernel is the netlink side of ipsets, in this package's types. Netlink
// implements it for the calling thread's network namespace.
type Kernel interface {
	// Get returns the set's description and entries; ok is false when it
	// does not exist.
	Get(name string) (s Set, entries []Entry, ok bool, err error)
	Names() ([]string, error)
	Create(s Set) error
	Destroy(name string) error
	Swap(a, b string) error
	Add(s Set, e Entry) error
	Del(s Set, e Entry) error
}

// Netlink is the real Kernel.
type Netlink struct{}

var _ Kernel = Netlink{}

func family(f datapath.Family) uint8 {
	if f == datapath.IPv6 {
		return unix.AF_INET6
	}
	return unix.AF_INET
}

// isNotExist reports the kernel's answer for a missing set.
func isNotExist(err error) bool {
	return errors.Is(err, syscall.ENOENT)
}

func (Netlink) Get(name string) (Set, []Entry, bool, error) {
	r, err := netlink.IpsetList(name)
	if err != nil {
		if isNotExist(err) {
			return Set{}, nil, false, nil
		}
		return Set{}, nil, false, fmt.Errorf("ipset: list %s: %w", name, err)
	}
	s := Set{Name: r.SetName, Type: Type(r.TypeName)}
	switch r.Family {
	case unix.AF_INET:
		s.Family = datapath.IPv4
	case unix.AF_INET6:
		s.Family = datapath.IPv6
	}
	entries := make([]Entry, 0, len(r.Entries))
	for _, ne := range r.Entries {
		var e Entry
		if ne.IP != nil {
			a, _ := netip.AddrFromSlice(ne.IP)
			e.Addr = a.Unmap()
		}
		if ne.Port != nil {
			e.Port = *ne.Port
		}
		if ne.Protocol != nil && s.Type != BitmapPort {
			e.Protocol = datapath.ProtocolOf(uint16(*ne.Protocol))
		}
		if ne.IP2 != nil {
			a, _ := netip.AddrFromSlice(ne.IP2)
			e.Addr2 = a.Unmap()
		}
		switch s.Type {
		case HashNet:
			e.Net = netip.PrefixFrom(e.Addr, int(ne.CIDR))
			e.Addr = netip.Addr{}
		case HashIPPortNet:
			e.Net = netip.PrefixFrom(e.Addr2, int(ne.CIDR2))
			e.Addr2 = netip.Addr{}
		}
		entries = append(entries, e)
	}
	return s, entries, true, nil
}

func (Netlink) Names() ([]string, error) {
	rs, err := netlink.IpsetListAll()
	if err != nil {
		return nil, fmt.Errorf("ipset: list sets: %w", err)
	}
	var names []string
	for _, r := range rs {
		if r.SetName != "" && !slices.Contains(names, r.SetName) {
			names = append(names, r.SetName)
		}
	}
	return names, nil
}

func (Netlink) Create(s Set) error {
	opts := netlink.IpsetCreateOptions{Family: family(s.Family)}
	if s.Type == BitmapPort {
		opts.PortFrom, opts.PortTo = 0, 65535
	}
	if err := netlink.IpsetCreate(s.Name, string(s.Type), opts); err != nil {
		return fmt.Errorf("ipset: create %s: %w", s, err)
	}
	return nil
}

func (Netlink) Destroy(name string) error {
	if err := netlink.IpsetDestroy(name); err != nil {
		if errors.Is(err, syscall.EBUSY) || errors.Is(err, nl.IPSetError(nl.IPSET_ERR_BUSY)) || errors.Is(err, nl.IPSetError(nl.IPSET_ERR_REFERENCED)) {
			err = fmt.Errorf("%w: %w", ErrInUse, err)
		}
		return fmt.Errorf("ipset: destroy %s: %w", name, err)
	}
	return nil
}

func (Netlink) Swap(a, b string) error {
	if err := netlink.IpsetSwap(a, b); err != nil {
		return fmt.Errorf("ipset: swap %s and %s: %w", a, b, err)
	}
	return nil
}

func toNetlink(e Entry) *netlink.IPSetEntry {
	var ne netlink.IPSetEntry
	if e.Addr.IsValid() {
		ne.IP = net.IP(e.Addr.AsSlice())
	}
	if e.Port != 0 {
		port := e.Port
		ne.Port = &port
		proto := e.Protocol.Number()
		if proto == 0 {
			proto = unix.IPPROTO_TCP // bitmap:port ignores it; netlink sets one anyway
		}
		ne.Protocol = &proto
	}
	if e.Addr2.IsValid() {
		ne.IP2 = net.IP(e.Addr2.AsSlice())
	}
	if e.Net.IsValid() {
		if e.Addr.IsValid() {
			ne.IP2 = net.IP(e.Net.Addr().AsSlice())
			ne.CIDR2 = uint8(e.Net.Bits())
		} else {
			ne.IP = net.IP(e.Net.Addr().AsSlice())
			ne.CIDR = uint8(e.Net.Bits())
		}
	}
	return &ne
}

func (Netlink) Add(s Set, e Entry) error {
	var err error
	if s.Type == BitmapPort {
		err = portOp(nl.IPSET_CMD_ADD, s.Name, e.Port)
	} else {
		err = netlink.IpsetAdd(s.Name, toNetlink(e))
	}
	if err != nil {
		return fmt.Errorf("ipset: add %s to %s: %w", e, s.Name, err)
	}
	return nil
}

func (Netlink) Del(s Set, e Entry) error {
	var err error
	if s.Type == BitmapPort {
		err = portOp(nl.IPSET_CMD_DEL, s.Name, e.Port)
	} else {
		err = netlink.IpsetDel(s.Name, toNetlink(e))
	}
	if err != nil {
		return fmt.Errorf("ipset: delete %s from %s: %w", e, s.Name, err)
	}
	return nil
}

// portOp adds or deletes a bitmap:port member. The netlink library always
// sends a protocol attribute with a port, which the kernel's bitmap:port
// rejects ("invalid protocol"), so this request is built here: set name,
// and a data attribute holding the port alone.
func portOp(cmd int, set string, port uint16) error {
	req := nl.NewNetlinkRequest(cmd|(unix.NFNL_SUBSYS_IPSET<<8), nl.GetIpsetFlags(cmd))
	req.AddData(&nl.Nfgenmsg{NfgenFamily: uint8(unix.AF_NETLINK), Version: nl.NFNETLINK_V0})
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_PROTOCOL, nl.Uint8Attr(nl.IPSET_PROTOCOL)))
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated(set)))
	data := nl.NewRtAttr(nl.IPSET_ATTR_DATA|int(nl.NLA_F_NESTED), nil)
	data.AddChild(nl.NewRtAttr(nl.IPSET_ATTR_PORT|int(nl.NLA_F_NET_BYTEORDER), []byte{byte(port >> 8), byte(port)}))
	data.AddChild(&nl.Uint32Attribute{Type: nl.IPSET_ATTR_LINENO | nl.NLA_F_NET_BYTEORDER, Value: 0})
	req.AddData(data)
	req.Flags |= unix.NLM_F_EXCL
	_, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	var errno syscall.Errno
	if errors.As(err, &errno) && int(errno) >= nl.IPSET_ERR_PRIVATE {
		err = nl.IPSetError(uintptr(errno))
	}
	return err
}
