// Package datapath defines what the agent asks the kernel to do: a Plan of
// frontends (service addresses) with weighted endpoints, and the Backend
// interface that makes the kernel match it. It knows nothing of Kubernetes;
// the agent translates Services and EndpointSlices into a Plan.
package datapath

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Protocol is a transport protocol as the kernel names it.
type Protocol string

const (
	TCP  Protocol = "TCP"
	UDP  Protocol = "UDP"
	SCTP Protocol = "SCTP"
)

// IP protocol numbers (IANA), as netlink (IPVS, ipset) carries them.
var protocolNumbers = map[Protocol]uint8{TCP: 6, UDP: 17, SCTP: 132}

// Number is p's IP protocol number, or 0 for a protocol we do not know.
func (p Protocol) Number() uint8 { return protocolNumbers[p] }

// ProtocolOf returns the protocol with IP protocol number n; an unknown
// number comes back as "proto-<n>", which no Protocol constant equals.
func ProtocolOf(n uint16) Protocol {
	for p, num := range protocolNumbers {
		if uint16(num) == n {
			return p
		}
	}
	return Protocol("proto-" + strconv.Itoa(int(n)))
}

// Kind says how traffic reaches a frontend; it decides masquerading and
// which traffic policy applies.
type Kind string

const (
	ClusterIP    Kind = "ClusterIP"
	NodePort     Kind = "NodePort"
	ExternalIP   Kind = "ExternalIP"
	LoadBalancer Kind = "LoadBalancer"
)

// External reports whether traffic to this kind of frontend comes from
// outside the cluster and so follows the external traffic policy.
func (k Kind) External() bool { return k != ClusterIP }

// MaxWeight is the largest endpoint weight a plan may carry. It matches the
// policy ABI's maximum and fits IPVS's signed 32-bit weight.
const MaxWeight = 10000

// Endpoint is one destination of a frontend.
type Endpoint struct {
	Addr   netip.AddrPort
	Weight uint32 // 1..MaxWeight; endpoints of weight 0 are left out of a plan
	Local  bool   // runs on this node
}

func (e Endpoint) String() string { return fmt.Sprintf("%s w=%d", e.Addr, e.Weight) }

// Frontend is one address:port:protocol that the node must answer for, with
// the endpoints that traffic to it is spread over.
type Frontend struct {
	// Service names the service port this frontend belongs to. Frontends
	// of one service port share it; datapaths use it to group, to sync
	// partially and (by its String form) to name kernel objects.
	Service  ServicePortName
	Kind     Kind
	Protocol Protocol
	// Addr is the virtual address. For a NodePort frontend it is invalid
	// (the zero Addr), meaning every node-port address of the node; Family
	// then says which IP family it serves.
	Addr   netip.Addr
	Family Family
	Port   uint16

	// Endpoints, already filtered by traffic policy and weighted. Empty
	// means the frontend has no endpoints: new connections are refused,
	// or dropped when Drop is set.
	Endpoints []Endpoint
	// Drop is set on a frontend without Endpoints whose service does have
	// usable endpoints, only none this frontend may use (traffic policy
	// Local and none on this node): its traffic is dropped, as kube-proxy
	// does, instead of refused.
	Drop bool
	// LocalOnly is set when the external traffic policy is Local: endpoints
	// are all on this node and the client's source address is kept.
	LocalOnly bool
	// Cluster, on a LocalOnly frontend, is the cluster-wide endpoint set
	// that traffic from pods and from the node itself goes to instead of
	// Endpoints (kube-proxy's short-circuit: policy Local never breaks
	// in-cluster reachability of an external address). Empty: that
	// traffic follows Endpoints too.
	Cluster []Endpoint
	// Serving lists every serving endpoint of the service port in this
	// family, whatever traffic policy, topology or policy modules chose
	// (UDP frontends only). Conntrack cleanup keeps flows to them, as
	// kube-proxy's: a short-circuited or terminating-but-serving flow is
	// live; empty means nothing is cleaned up for this frontend.
	Serving []netip.AddrPort
	// Affinity is the ClientIP session affinity timeout; zero means none.
	Affinity time.Duration
	// SourceRanges restricts who may reach a LoadBalancer frontend; empty
	// means anyone.
	SourceRanges []netip.Prefix
	// SourceRangesHoldNode is set when a source range holds the node's
	// primary address of the family: the load balancer's own address is
	// then let through as a source too, as kube-proxy does, because a
	// VIP-like balancer whose address is local to the node loops the
	// node's requests back with that address as their source.
	SourceRangesHoldNode bool `json:",omitempty"`
	// Scheduler is the IPVS scheduler (empty: the configured default), with
	// optional scheduler flags. The iptables datapath ignores both.
	Scheduler      string
	SchedulerFlags []string
}

// Family is an IP family.
type Family uint8

const (
	IPv4 Family = 4
	IPv6 Family = 6
)

// FamilyOf returns the family of a.
func FamilyOf(a netip.Addr) Family {
	if a.Is4() || a.Is4In6() {
		return IPv4
	}
	return IPv6
}

// Key identifies a frontend within a plan.
type Key struct {
	Kind     Kind
	Protocol Protocol
	Addr     netip.Addr
	Family   Family
	Port     uint16
}

// Key returns the frontend's identity.
func (f *Frontend) Key() Key {
	return Key{Kind: f.Kind, Protocol: f.Protocol, Addr: f.Addr, Family: f.Family, Port: f.Port}
}

// AddrString is the frontend's address as shown to people: "*" stands for
// every node-port address of its family.
func (f *Frontend) AddrString() string {
	if !f.Addr.IsValid() {
		if f.Family == IPv6 {
			return "[*]:" + fmt.Sprint(f.Port)
		}
		return "*:" + fmt.Sprint(f.Port)
	}
	return netip.AddrPortFrom(f.Addr, f.Port).String()
}

// String renders one line: protocol, address:port, kind, service and the
// weighted endpoints. The format is stable; tests compare it.
func (f *Frontend) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-4s %s %s %s", f.Protocol, f.AddrString(), f.Kind, f.Service)
	if f.LocalOnly {
		b.WriteString(" local")
	}
	if f.Drop {
		b.WriteString(" drop")
	}
	if f.Affinity > 0 {
		fmt.Fprintf(&b, " affinity=%s", f.Affinity)
	}
	if len(f.SourceRanges) > 0 {
		rs := make([]string, len(f.SourceRanges))
		for i, r := range f.SourceRanges {
			rs[i] = r.String()
		}
		fmt.Fprintf(&b, " from=%s", strings.Join(rs, ","))
		if f.SourceRangesHoldNode {
			b.WriteString("+self")
		}
	}
	if f.Scheduler != "" {
		fmt.Fprintf(&b, " sched=%s", f.Scheduler)
		if len(f.SchedulerFlags) > 0 {
			fmt.Fprintf(&b, "(%s)", strings.Join(f.SchedulerFlags, ","))
		}
	}
	b.WriteString(" ->")
	if len(f.Endpoints) == 0 {
		b.WriteString(" (none)")
	}
	writeEndpoints(&b, f.Endpoints)
	if len(f.Cluster) > 0 {
		b.WriteString(" | short-circuit ->")
		writeEndpoints(&b, f.Cluster)
	}
	return b.String()
}

func writeEndpoints(b *strings.Builder, eps []Endpoint) {
	for i, e := range eps {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(b, " %s w=%d", e.Addr, e.Weight)
	}
}

// Plan is everything the node must program. The agent completes it (the
// planner builds and sorts it; Sanitize, Changed and Full are set before
// Apply) and then hands it over: from Apply on it is read-only, and a
// Backend never modifies a plan it is given (it copies what it adjusts).
type Plan struct {
	// Generation increases with every plan the agent computes.
	Generation uint64
	// Frontends, sorted by Compare.
	Frontends []Frontend
	// Changed names the service ports (Frontend.Service) that changed since
	// the previous plan handed to the same Backend. Full is set when the
	// backend must not rely on Changed and has to compare everything, e.g.
	// the first plan, after a failed apply, or on a periodic resync.
	Changed map[ServicePortName]bool
	Full    bool
	// NodeIPs are the node's primary addresses, at most one per family
	// (from its Node object), for node ports restricted to them.
	NodeIPs []netip.Addr
	// PodCIDRs are the node's pod ranges (its Node's spec.podCIDRs), for
	// telling traffic from this node's pods by them (kube-proxy's
	// detect-local-mode NodeCIDR).
	PodCIDRs []netip.Prefix `json:",omitempty"` // left out when none: the file format of older snapshots
	// HealthCheckPorts are the TCP ports of the Services' health checks
	// (healthCheckNodePort), sorted; a firewall must let them in.
	HealthCheckPorts []uint16
}

// Compare orders frontends by service, then kind, address, port and protocol.
func Compare(a, b *Frontend) int {
	if c := a.Service.Compare(b.Service); c != 0 {
		return c
	}
	if c := strings.Compare(string(a.Kind), string(b.Kind)); c != 0 {
		return c
	}
	if c := int(a.Family) - int(b.Family); c != 0 {
		return c
	}
	if c := a.Addr.Compare(b.Addr); c != 0 {
		return c
	}
	if c := int(a.Port) - int(b.Port); c != 0 {
		return c
	}
	return strings.Compare(string(a.Protocol), string(b.Protocol))
}

// Sort puts the plan's frontends in their canonical order.
func (p *Plan) Sort() {
	slices.SortFunc(p.Frontends, func(a, b Frontend) int { return Compare(&a, &b) })
}

// PortFrontends returns the frontends of the service port named name, a
// part of p.Frontends (found by binary search: the plan must be sorted).
func (p *Plan) PortFrontends(name ServicePortName) []Frontend {
	cmp := func(f Frontend, n ServicePortName) int { return f.Service.Compare(n) }
	i, ok := slices.BinarySearchFunc(p.Frontends, name, cmp)
	if !ok {
		return nil
	}
	j := i + 1
	for j < len(p.Frontends) && p.Frontends[j].Service == name {
		j++
	}
	return p.Frontends[i:j:j]
}

// String renders one line per frontend, in order. Stable for golden tests.
func (p *Plan) String() string {
	var b strings.Builder
	for i := range p.Frontends {
		b.WriteString(p.Frontends[i].String())
		b.WriteByte('\n')
	}
	return b.String()
}

// Validate checks the invariants a Backend relies on and returns every
// violation found, joined. A plan that went through Sanitize passes.
func (p *Plan) Validate() error {
	var errs []string
	seen := make(map[Key]ServicePortName, len(p.Frontends))
	for i := range p.Frontends {
		f := &p.Frontends[i]
		where := fmt.Sprintf("frontend %s %s (%s)", f.Protocol, f.AddrString(), f.Service)
		for _, pr := range frontendProblems(f) {
			errs = append(errs, where+": "+pr)
		}
		if prev, dup := seen[f.Key()]; dup {
			errs = append(errs, fmt.Sprintf("%s: duplicates a frontend of %s", where, prev))
		}
		seen[f.Key()] = f.Service
	}
	if len(errs) > 0 {
		return fmt.Errorf("datapath: invalid plan: %s", strings.Join(errs, "; "))
	}
	return nil
}

// Backend makes the kernel match a plan. Implementations must be idempotent:
// applying the same plan twice changes nothing, and applying a plan after a
// crash, or after someone removed kernel objects, repairs them.
type Backend interface {
	// Name is the mode, e.g. "iptables", "ipvs" or "plan".
	Name() string
	// Apply programs p. An error means the kernel may only partly match p;
	// the caller then hands the next plan with Full set.
	Apply(ctx context.Context, p *Plan) error
	// Cleanup removes every kernel object this backend ever created.
	Cleanup(ctx context.Context) error
}

// Monitor is implemented by backends that can tell when their kernel objects
// were changed behind their back (e.g. a chain flushed by hand). The agent
// polls it every few seconds and answers true with a full sync.
type Monitor interface {
	Tampered(ctx context.Context) (bool, error)
}

// Watcher is implemented by monitors whose kernel can announce writes to
// their objects (nf_tables: every committed transaction), so that a quiet
// node need not poll Tampered. WatchWrites sends on written, without
// blocking (give it one slot: signals coalesce), once as soon as it
// watches and then after writes (anyone's, its own backend's too), until
// ctx is done; then it returns nil. While it runs, Tampered need only be
// asked after a signal. It returns an error wrapping ErrNoWatch at once
// when the backend cannot watch (e.g. iptables-legacy: x_tables announces
// nothing), and another error when the watch fails; either way the caller
// polls Tampered as before.
type Watcher interface {
	WatchWrites(ctx context.Context, written chan<- struct{}) error
}

// ErrNoWatch is wrapped by WatchWrites when the backend cannot watch.
var ErrNoWatch = errors.New("datapath: writes to this backend's kernel objects are not announced")

// Drainer is implemented by backends that keep removed endpoints for a while
// (IPVS real servers at weight 0 until their connections end). While
// Draining reports more than zero, the agent keeps syncing so they are
// removed as soon as they may be.
type Drainer interface {
	Draining() int
}
