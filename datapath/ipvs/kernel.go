package ipvs

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	mobyipvs "github.com/moby/ipvs"
	"golang.org/x/sys/unix"

	"github.com/edgeproxy/edgeproxy/datapath"
)

// Flags are IPVS virtual-server flags (IP_VS_SVC_F_*).
type Flags uint32

const (
	FlagPersistent Flags = 0x0001 // session affinity: persistence with Timeout
	flagHashed     Flags = 0x0002 // set by the kernel on every service; never compared
	FlagOnePacket  Flags = 0x0004
	FlagSched1     Flags = 0x0008 // sh-fallback, mh-fallback
	FlagSched2     Flags = 0x0010 // sh-port, mh-port
	FlagSched3     Flags = 0x0020
)

// schedulerFlags maps the names users write to the flag bits.
var schedulerFlags = map[string]Flags{
	"sh-fallback": FlagSched1, "sh-port": FlagSched2,
	"mh-fallback": FlagSched1, "mh-port": FlagSched2,
	"flag-1": FlagSched1, "flag-2": FlagSched2, "flag-3": FlagSched3,
}

// VirtualServer is an IPVS service: the address:port:protocol the kernel
// balances, its scheduler and persistence.
type VirtualServer struct {
	Addr      netip.Addr
	Protocol  datapath.Protocol
	Port      uint16
	Scheduler string
	Flags     Flags
	Timeout   uint32 // persistence timeout in seconds, with FlagPersistent
}

// Key identifies a virtual server in the kernel.
type Key struct {
	Addr     netip.Addr
	Protocol datapath.Protocol
	Port     uint16
}

func (v VirtualServer) Key() Key { return Key{v.Addr, v.Protocol, v.Port} }

func (k Key) String() string {
	return fmt.Sprintf("%s %s", k.Protocol, netip.AddrPortFrom(k.Addr, k.Port))
}

func (v VirtualServer) String() string {
	s := fmt.Sprintf("%s %s", v.Key(), v.Scheduler)
	if v.Flags&^flagHashed != 0 {
		s += fmt.Sprintf(" flags=%#x", uint32(v.Flags&^flagHashed))
	}
	if v.Flags&FlagPersistent != 0 {
		s += fmt.Sprintf(" persistent=%d", v.Timeout)
	}
	return s
}

// RealServer is a destination of a virtual server, forwarded by
// masquerading (NAT).
type RealServer struct {
	Addr     netip.AddrPort
	Weight   int
	Active   int // active connections, as reported by the kernel
	Inactive int // inactive connections, as reported by the kernel
}

func (r RealServer) String() string { return fmt.Sprintf("%s w=%d", r.Addr, r.Weight) }

// Kernel is the part of IPVS the proxier uses, in its own types. Netlink
// implements it over generic netlink (github.com/moby/ipvs).
type Kernel interface {
	VirtualServers() ([]VirtualServer, error)
	AddVirtualServer(VirtualServer) error
	UpdateVirtualServer(VirtualServer) error
	DeleteVirtualServer(VirtualServer) error
	RealServers(VirtualServer) ([]RealServer, error)
	AddRealServer(VirtualServer, RealServer) error
	UpdateRealServer(VirtualServer, RealServer) error
	DeleteRealServer(VirtualServer, RealServer) error
	// SetTimeouts sets the IPVS connection timeouts; zero keeps a value.
	SetTimeouts(tcp, tcpFin, udp time.Duration) error
	Close() error
}

// ErrNoIPVS is wrapped when the kernel has no IPVS (module ip_vs missing).
var ErrNoIPVS = errors.New("ipvs: the kernel has no IPVS (load module ip_vs)")

// Netlink is the real Kernel, bound to the network namespace it was opened
// in.
type Netlink struct{ h *mobyipvs.Handle }

var _ Kernel = (*Netlink)(nil)

// Open opens an IPVS handle in the calling thread's network namespace.
func Open() (*Netlink, error) {
	h, err := mobyipvs.New("")
	if err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return nil, fmt.Errorf("%w: %w", ErrNoIPVS, err)
		}
		return nil, fmt.Errorf("ipvs: open generic netlink: %w", err)
	}
	return &Netlink{h: h}, nil
}

func (n *Netlink) Close() error { n.h.Close(); return nil }

func toMobyService(v VirtualServer) *mobyipvs.Service {
	s := &mobyipvs.Service{
		Address:   net.IP(v.Addr.AsSlice()),
		Protocol:  uint16(v.Protocol.Number()),
		Port:      v.Port,
		SchedName: v.Scheduler,
		Flags:     uint32(v.Flags &^ flagHashed),
		Timeout:   v.Timeout,
	}
	if v.Addr.Is4() {
		s.AddressFamily, s.Netmask = unix.AF_INET, 0xffffffff
	} else {
		s.AddressFamily, s.Netmask = unix.AF_INET6, 128
	}
	return s
}

func fromMobyService(s *mobyipvs.Service) (VirtualServer, bool) {
	a, ok := netip.AddrFromSlice(s.Address)
	if !ok || s.FWMark != 0 {
		return VirtualServer{}, false
	}
	if s.AddressFamily == unix.AF_INET {
		a = a.Unmap()
	}
	return VirtualServer{
		Addr: a, Protocol: datapath.ProtocolOf(s.Protocol), Port: s.Port,
		Scheduler: s.SchedName, Flags: Flags(s.Flags) &^ flagHashed, Timeout: s.Timeout,
	}, true
}

func toMobyDest(v VirtualServer, r RealServer) *mobyipvs.Destination {
	d := &mobyipvs.Destination{
		Address:         net.IP(r.Addr.Addr().AsSlice()),
		Port:            r.Addr.Port(),
		Weight:          r.Weight,
		ConnectionFlags: mobyipvs.ConnectionFlagMasq,
	}
	if r.Addr.Addr().Is4() {
		d.AddressFamily = unix.AF_INET
	} else {
		d.AddressFamily = unix.AF_INET6
	}
	return d
}

func (n *Netlink) VirtualServers() ([]VirtualServer, error) {
	ss, err := n.h.GetServices()
	if err != nil {
		return nil, fmt.Errorf("ipvs: list virtual servers: %w", err)
	}
	out := make([]VirtualServer, 0, len(ss))
	for _, s := range ss {
		if v, ok := fromMobyService(s); ok {
			out = append(out, v)
		}
	}
	return out, nil
}

func (n *Netlink) AddVirtualServer(v VirtualServer) error {
	if err := n.h.NewService(toMobyService(v)); err != nil {
		return fmt.Errorf("ipvs: add virtual server %s: %w", v, err)
	}
	return nil
}

func (n *Netlink) UpdateVirtualServer(v VirtualServer) error {
	if err := n.h.UpdateService(toMobyService(v)); err != nil {
		return fmt.Errorf("ipvs: update virtual server %s: %w", v, err)
	}
	return nil
}

func (n *Netlink) DeleteVirtualServer(v VirtualServer) error {
	if err := n.h.DelService(toMobyService(v)); err != nil {
		return fmt.Errorf("ipvs: delete virtual server %s: %w", v.Key(), err)
	}
	return nil
}

func (n *Netlink) RealServers(v VirtualServer) ([]RealServer, error) {
	ds, err := n.h.GetDestinations(toMobyService(v))
	if err != nil {
		return nil, fmt.Errorf("ipvs: list real servers of %s: %w", v.Key(), err)
	}
	out := make([]RealServer, 0, len(ds))
	for _, d := range ds {
		a, ok := netip.AddrFromSlice(d.Address)
		if !ok {
			continue
		}
		if d.AddressFamily == unix.AF_INET {
			a = a.Unmap()
		}
		out = append(out, RealServer{
			Addr: netip.AddrPortFrom(a, d.Port), Weight: d.Weight,
			Active: d.ActiveConnections, Inactive: d.InactiveConnections,
		})
	}
	return out, nil
}

func (n *Netlink) AddRealServer(v VirtualServer, r RealServer) error {
	if err := n.h.NewDestination(toMobyService(v), toMobyDest(v, r)); err != nil {
		return fmt.Errorf("ipvs: add real server %s to %s: %w", r, v.Key(), err)
	}
	return nil
}

func (n *Netlink) UpdateRealServer(v VirtualServer, r RealServer) error {
	if err := n.h.UpdateDestination(toMobyService(v), toMobyDest(v, r)); err != nil {
		return fmt.Errorf("ipvs: update real server %s of %s: %w", r, v.Key(), err)
	}
	return nil
}

func (n *Netlink) DeleteRealServer(v VirtualServer, r RealServer) error {
	if err := n.h.DelDestination(toMobyService(v), toMobyDest(v, r)); err != nil {
		return fmt.Errorf("ipvs: delete real server %s of %s: %w", r.Addr, v.Key(), err)
	}
	return nil
}

func (n *Netlink) SetTimeouts(tcp, tcpFin, udp time.Duration) error {
	if err := n.h.SetConfig(&mobyipvs.Config{TimeoutTCP: tcp, TimeoutTCPFin: tcpFin, TimeoutUDP: udp}); err != nil {
		return fmt.Errorf("ipvs: set timeouts: %w", err)
	}
	return nil
}
