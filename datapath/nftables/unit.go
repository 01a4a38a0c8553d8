package nftables

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables/expr"

	"github.com/edgeproxy/edgeproxy/datapath"
)

// ErrUnsupported is wrapped by the *datapath.PortError Apply returns for
// a service port with a frontend this datapath cannot program (an unknown
// kind or protocol): those frontends are left
// out, the rest of the plan is programmed.
var ErrUnsupported = errors.New("nftables: not supported yet")

// unsupported says why f cannot be programmed faithfully yet, or "".
// Everything else of the plan is programmed as kube-proxy's nftables
// mode does: ClusterIP, NodePort, ExternalIP and LoadBalancer frontends
// (with source ranges), traffic policies Cluster and Local, session
// affinity.
func unsupported(f *datapath.Frontend) string {
	switch {
	case f.Kind != datapath.ClusterIP && f.Kind != datapath.NodePort && f.Kind != datapath.ExternalIP && f.Kind != datapath.LoadBalancer:
		return "frontend kind " + string(f.Kind)
	case f.Protocol.Number() == 0:
		return "protocol " + string(f.Protocol)
	}
	return ""
}

// supported returns the frontends this datapath programs and, for each
// service port with one it cannot, a *datapath.PortError wrapping
// ErrUnsupported that says why and how many of its frontends are left
// out. Only those frontends are: one Service with a frontend of an
// unknown kind must not stop every other Service, nor its other frontends.
// frontends itself is returned when nothing is left out.
func supported(frontends []datapath.Frontend) ([]datapath.Frontend, []error) {
	type refusal struct {
		why []string
		n   int
	}
	var order []datapath.ServicePortName
	refused := map[datapath.ServicePortName]*refusal{}
	for i := range frontends {
		why := unsupported(&frontends[i])
		if why == "" {
			continue
		}
		s := frontends[i].Service
		r := refused[s]
		if r == nil {
			r = &refusal{}
			refused[s] = r
			order = append(order, s)
		}
		if !slices.Contains(r.why, why) {
			r.why = append(r.why, why)
		}
		r.n++
	}
	if len(refused) == 0 {
		return frontends, nil
	}
	kept := make([]datapath.Frontend, 0, len(frontends))
	for i := range frontends {
		if unsupported(&frontends[i]) == "" {
			kept = append(kept, frontends[i])
		}
	}
	errs := make([]error, 0, len(order))
	for _, s := range order {
		r := refused[s]
		slices.Sort(r.why)
		errs = append(errs, &datapath.PortError{Service: s,
			Err: fmt.Errorf("%w: %s (%d of its frontends)", ErrUnsupported, strings.Join(r.why, ", "), r.n)})
	}
	return kept, errs
}

// elemKey is one element of one of the fixed maps or sets: the set's name
// and the element's key bytes (and, in an interval set, the key's end).
type elemKey struct {
	tab uint8 // the table: 0 the main one, i+1 shard i
	set string
	key string
	end string
}

// compare orders elements by table, set, then key, then end.
func (k elemKey) compare(o elemKey) int {
	if k.tab != o.tab {
		return int(k.tab) - int(o.tab)
	}
	if c := strings.Compare(k.set, o.set); c != 0 {
		return c
	}
	if c := strings.Compare(k.key, o.key); c != 0 {
		return c
	}
	return strings.Compare(k.end, o.end)
}

// shared is an element units share, counted across them (see unit): an
// address in the main table's cluster-ips or hairpin set. It holds no
// pointer (18 bytes: the set, the family, the address), so neither the table's counts
// nor the units' lists give the garbage collector anything to scan, and
// a Service's endpoints cost no string each; elemKey renders it as the
// element's key bytes when a message is written.
type shared struct {
	set  uint8    // sharedClusterIPs or sharedHairpin
	four bool     // an IPv4 address, in the last 4 bytes of addr
	addr [16]byte // the address (netip.Addr.As16)
}

// The sets of shared elements, in the order of their names.
const (
	sharedClusterIPs uint8 = iota // cluster-ips: the address
	sharedHairpin                 // hairpin: the address twice
)

func sharedOf(set uint8, a netip.Addr) shared {
	return shared{set: set, four: a.Is4(), addr: a.As16()}
}

// address is the address of s (its zone, if any, dropped, as the
// element's bytes drop it).
func (s shared) address() netip.Addr {
	if s.four {
		return netip.AddrFrom4([4]byte(s.addr[12:]))
	}
	return netip.AddrFrom16(s.addr)
}

func (s shared) setName() string {
	if s.set == sharedHairpin {
		return setHairpin
	}
	return setClusterIPs
}

// elemKey is the element s stands for, in the main table.
func (s shared) elemKey() elemKey {
	a := s.address()
	if s.set == sharedHairpin {
		return elemKey{set: setHairpin, key: keyHairpin(a)}
	}
	return elemKey{set: setClusterIPs, key: string(a.AsSlice())}
}

// compare orders shared elements as their elemKeys are ordered (by set
// name, then key; one unit's are all of one family).
func (s shared) compare(o shared) int {
	if s.set != o.set {
		return int(s.set) - int(o.set)
	}
	if s.four != o.four {
		if s.four {
			return -1
		}
		return 1
	}
	return bytes.Compare(s.addr[:], o.addr[:])
}

// disjoint returns the prefixes of family fam in ps, masked, without
// those inside another (two prefixes overlap only so): an interval set
// refuses overlapping elements.
func disjoint(ps []netip.Prefix, fam datapath.Family) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if datapath.FamilyOf(p.Addr()) == fam {
			out = append(out, p.Masked())
		}
	}
	// Broader first, so that a prefix is kept only when none kept
	// before contains it.
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Bits() - b.Bits(); c != 0 {
			return c
		}
		return a.Addr().Compare(b.Addr())
	})
	kept := out[:0]
	for _, p := range out {
		if !slices.ContainsFunc(kept, func(k netip.Prefix) bool { return k.Contains(p.Addr()) }) {
			kept = append(kept, p)
		}
	}
	return kept
}

// prefixRange returns the first and last address of p.
func prefixRange(p netip.Prefix) (netip.Addr, netip.Addr) {
	p = p.Masked()
	last := p.Addr().AsSlice()
	for i := p.Bits(); i < len(last)*8; i++ {
		last[i/8] |= 0x80 >> (i % 8)
	}
	l, _ := netip.AddrFromSlice(last)
	return p.Addr(), l
}

// target is what a map element points at.
type target struct {
	kind  expr.VerdictKind
	chain string
}

// unit is what one service port puts into the table of one family: its
// chains (ordered so that a chain comes before those that jump to it),
// its elements in the fixed maps, and the elements it shares with other
// units, counted across them (compact: shared): its endpoints in the
// hairpin set (two Services may share one) and its cluster IPs in the
// cluster-ips set (each port of a Service is a unit).
//
// A unit as built holds its rules and an element map; what the Proxier
// keeps between syncs is its summary: chain names and digests (held),
// the elements as a short list, no rule (a few hundred bytes a Service).
type unit struct {
	chains  []chainSpec        // built units
	held    []heldChain        // summaries: the chains, in the same order
	elems   map[elemKey]target // built units
	list    []elemEntry        // summaries
	counted []shared           // sorted (shared.compare)
	affSets []string           // its per-endpoint affinity sets, sorted
	input   uint64             // inputHash of the frontends it was built from
	tab     uint8              // its service table (its chains, affinity sets and dispatch elements)
}

type elemEntry struct {
	k elemKey
	t target
}

// heldChain is what a summary keeps of a chain: what a partial sync
// compares (name, digest) and deletes by (table, name). A chainSpec
// without its rules would be three times its size.
type heldChain struct {
	tab    uint8
	name   string
	digest [16]byte
}

// spec is the chain as much as deleting it needs.
func (h heldChain) spec() chainSpec { return chainSpec{tab: h.tab, name: h.name} }

// summary is u without its rules, as kept between syncs.
func (u *unit) summary() *unit {
	s := &unit{counted: u.counted, affSets: u.affSets, input: u.input, tab: u.tab}
	if len(u.chains) > 0 {
		s.held = make([]heldChain, len(u.chains))
		for i, c := range u.chains {
			s.held[i] = heldChain{tab: c.tab, name: c.name, digest: c.digest}
		}
	}
	if len(u.elems) > 0 {
		s.list = make([]elemEntry, 0, len(u.elems))
		for k, t := range u.elems {
			s.list = append(s.list, elemEntry{k, t})
		}
	}
	return s
}

// elemMap returns the unit's elements as a map, whether built or summed up.
func (u *unit) elemMap() map[elemKey]target {
	if u.elems != nil || u.list == nil {
		return u.elems
	}
	m := make(map[elemKey]target, len(u.list))
	for _, e := range u.list {
		m[e.k] = e.t
	}
	return m
}

// keyAddrProtoPort is the key of "daddr . inet_proto . inet_service":
// each field padded to 32 bits, as nf_tables stores concatenations.
func keyAddrProtoPort(a netip.Addr, p datapath.Protocol, port uint16) string {
	b := a.AsSlice()
	b = append(b, p.Number(), 0, 0, 0)
	b = binary.BigEndian.AppendUint16(b, port)
	return string(append(b, 0, 0))
}

func keyProtoPort(p datapath.Protocol, port uint16) string {
	b := []byte{p.Number(), 0, 0, 0}
	b = binary.BigEndian.AppendUint16(b, port)
	return string(append(b, 0, 0))
}

func keyHairpin(a netip.Addr) string { return string(append(a.AsSlice(), a.AsSlice()...)) }

// buildUnit lays out one service port's frontends of one family (all of
// them supported, see supported). Each distinct list of endpoints gets one
// load-balancing chain: "svc-NS/NAME/PORT" for the first, then ".2", ".3"
// (the internal traffic policy Local gives the cluster IP local endpoints,
// the external one other frontends theirs; a port name cannot hold a dot,
// so the names never collide). External frontends go through an "ext-"
// chain, one per distinct behaviour, named the same way.
func buildUnit(f *fam, o *Options, fs []datapath.Frontend) (*unit, error) {
	u := &unit{elems: map[elemKey]target{}, input: inputHash(fs)}
	if len(fs) == 0 {
		return u, nil
	}
	u.tab = shardOf(fs[0].Service, o.shardCount())
	base := chainName(svcPrefix, fs[0].Service)
	if len(chainName(extPrefix, fs[0].Service))+4 > maxChainLen {
		return nil, fmt.Errorf("nftables: chain name of %s is longer than %d bytes", fs[0].Service, maxChainLen-4)
	}
	bit := uint32(1) << o.MasqueradeBit
	pods := o.pods(f.family)
	var lbs, exts []*chainSpec
	// lb returns the load-balancing chain of eps.
	lb := func(eps []datapath.Endpoint) *chainSpec {
		for _, c := range lbs {
			if slices.Equal(c.eps, eps) {
				return c
			}
		}
		c := &chainSpec{tab: u.tab, name: base + suffix(len(lbs)), eps: eps}
		lbs = append(lbs, c)
		return c
	}
	// withAffinity returns lb(eps) with the frontend's session affinity.
	withAffinity := func(eps []datapath.Endpoint, fr *datapath.Frontend) *chainSpec {
		c := lb(eps)
		c.affinity = max(c.affinity, fr.Affinity)
		return c
	}
	// ext returns the name of the external chain holding rules.
	ext := func(rules []rule) string {
		for _, c := range exts {
			if slices.EqualFunc(c.rules, rules, func(a, b rule) bool { return a.text == b.text }) {
				return c.name
			}
		}
		c := &chainSpec{tab: u.tab, name: chainName(extPrefix, fs[0].Service) + suffix(len(exts)), rules: rules}
		exts = append(exts, c)
		return c.name
	}
	for i := range fs {
		fr := &fs[i]
		if fr.Kind == datapath.ClusterIP {
			// Its ports no Service has are rejected (cluster-ips-check).
			k := sharedOf(sharedClusterIPs, fr.Addr)
			if !slices.Contains(u.counted, k) {
				u.counted = append(u.counted, k)
			}
		}
		key := elemKey{tab: u.tab, set: mapServiceIPs, key: keyAddrProtoPort(fr.Addr, fr.Protocol, fr.Port)}
		noEP := elemKey{set: mapNoEndpoints, key: key.key}
		if fr.Kind == datapath.NodePort {
			key = elemKey{tab: u.tab, set: mapNodePorts, key: keyProtoPort(fr.Protocol, fr.Port)}
			noEP = elemKey{set: mapNoEPPorts, key: key.key}
		}
		if fr.Kind == datapath.LoadBalancer && len(fr.SourceRanges) > 0 {
			// Only the listed sources may reach it (their family's; none
			// of this family: nobody), before DNAT, whether or not it has
			// endpoints, as kube-proxy.
			u.elems[elemKey{set: setFirewallIPs, key: key.key}] = target{}
			ranges := fr.SourceRanges
			if fr.SourceRangesHoldNode {
				// The node's requests, looped back by a balancer whose
				// address is local, come from that address.
				ranges = append(slices.Clip(ranges), netip.PrefixFrom(fr.Addr, fr.Addr.BitLen()))
			}
			for _, r := range disjoint(ranges, f.family) {
				first, last := prefixRange(r)
				u.elems[elemKey{set: setFirewallAllow, key: key.key + string(first.AsSlice()), end: key.key + string(last.AsSlice())}] = target{}
			}
		}
		if len(fr.Endpoints) == 0 {
			// Refused, or dropped (Drop: the service has endpoints, none
			// this frontend may use) in the filter chains. A Local frontend
			// may still short-circuit pods and the node to Cluster: their
			// packets are DNATed before the filter chains look.
			t := target{kind: expr.VerdictGoto, chain: chainReject}
			if fr.Drop {
				t = target{kind: expr.VerdictDrop}
			}
			u.elems[noEP] = t
			if !fr.LocalOnly || len(fr.Cluster) == 0 || !fr.Kind.External() {
				continue
			}
		}
		if !fr.Kind.External() {
			c := withAffinity(fr.Endpoints, fr)
			u.elems[key] = target{kind: expr.VerdictGoto, chain: c.name}
			switch {
			case o.MasqueradeAll:
				// Every source, pods too (kube-proxy).
				c.marks = append(c.marks, ruleMarkFrom(f, fr.Addr, podMatch{}, bit))
			case pods.valid():
				c.marks = append(c.marks, ruleMarkFrom(f, fr.Addr, pods, bit))
			}
			continue
		}
		var rules []rule
		if !fr.LocalOnly {
			// Cluster policy: masquerade, as the endpoint may be on
			// another node.
			rules = []rule{ruleMark(bit), ruleGoto(withAffinity(fr.Endpoints, fr).name)}
		} else {
			// Local: the client's address is kept. Pods and the node
			// itself are short-circuited to the cluster-wide endpoints
			// (kube-proxy's rule: the policy never breaks in-cluster
			// reachability); the node's own traffic is masqueraded, its
			// source being a local address.
			cluster := fr.Cluster
			if len(cluster) == 0 {
				cluster = fr.Endpoints
			}
			cl := withAffinity(cluster, fr).name
			if pods.valid() {
				rules = append(rules, ruleFromGoto(f, pods, cl))
			}
			rules = append(rules, ruleLocalSourceMark(bit), ruleLocalSourceGoto(cl))
			if len(fr.Endpoints) > 0 {
				rules = append(rules, ruleGoto(withAffinity(fr.Endpoints, fr).name))
			}
		}
		u.elems[key] = target{kind: expr.VerdictGoto, chain: ext(rules)}
	}
	proto := fs[0].Protocol
	seen := map[netip.Addr]bool{}
	affSet := func(ep netip.AddrPort) string { return affinitySetName(fs[0].Service, ep) }
	for _, c := range lbs {
		c.rules = append(c.marks, balance(f, proto, c.eps, c.affinity, affSet)...)
		if c.affinity > 0 {
			for _, e := range c.eps {
				n := affSet(e.Addr)
				if len(n) >= maxChainLen {
					return nil, fmt.Errorf("nftables: affinity set name %s is longer than %d bytes", n, maxChainLen-1)
				}
				if !slices.Contains(u.affSets, n) {
					u.affSets = append(u.affSets, n)
				}
			}
		}
		c.marks, c.eps = nil, nil
		u.chains = append(u.chains, *c)
	}
	slices.Sort(u.affSets)
	for _, fr := range fs {
		// Never append to the plan's slices: a Backend does not modify
		// the plan it is given.
		for _, eps := range [][]datapath.Endpoint{fr.Endpoints, fr.Cluster} {
			for _, e := range eps {
				if !seen[e.Addr.Addr()] {
					seen[e.Addr.Addr()] = true
					u.counted = append(u.counted, sharedOf(sharedHairpin, e.Addr.Addr()))
				}
			}
		}
	}
	for _, c := range exts {
		u.chains = append(u.chains, *c)
	}
	for i := range u.chains {
		u.chains[i].seal()
	}
	slices.SortFunc(u.counted, shared.compare)
	if cap(u.counted) > len(u.counted) {
		// Kept between syncs (summary): no room for appends.
		u.counted = slices.Clone(u.counted)
	}
	return u, nil
}

// suffix names the i-th chain of a kind within a unit: "", ".2", ".3", …
func suffix(i int) string {
	if i == 0 {
		return ""
	}
	return fmt.Sprintf(".%d", i+1)
}

// balance spreads new connections over eps by their weights, exactly.
// Without session affinity and with more than one endpoint, that is one
// rule and its map (ruleDNATMap); otherwise a cascade.
func balance(f *fam, proto datapath.Protocol, eps []datapath.Endpoint, affinity time.Duration, affSet func(netip.AddrPort) string) []rule {
	if affinity > 0 || len(eps) < 2 {
		return cascade(f, proto, eps, affinity, affSet)
	}
	return []rule{ruleDNATMap(f, proto, eps, reduced(eps))}
}

// reduced is the weights of eps (at least 1 each) divided by their
// greatest common divisor: equal weights are all 1.
func reduced(eps []datapath.Endpoint) []uint32 {
	g := uint32(0)
	for _, e := range eps {
		g = gcd(g, max(e.Weight, 1))
	}
	ws := make([]uint32, len(eps))
	for i, e := range eps {
		ws[i] = max(e.Weight, 1) / g
	}
	return ws
}

// cascade spreads new connections over eps by their weights, exactly: the
// rule of endpoint i matches with probability w_i / (w_i + … + w_n) among
// the packets that reach it, so endpoint i gets w_i / Σw of them. Weights
// are divided by their greatest common divisor first, so equal weights
// give "numgen random mod n 0" rules and no byte-order conversion.
//
// With session affinity (a timeout), as kube-proxy's nftables mode: each
// endpoint has its own set of client addresses, affSet(endpoint), which
// the rules before the cascade look up, one per endpoint, renewing the
// client's timeout on every hit; each rule of the cascade remembers the
// client in the set of the endpoint it picks, and a last rule without
// the update catches a client the full set could not take. A client
// sticks to its endpoint across the service port's frontends.
func cascade(f *fam, proto datapath.Protocol, eps []datapath.Endpoint, affinity time.Duration, affSet func(netip.AddrPort) string) []rule {
	ws := reduced(eps)
	rest := uint32(0)
	for _, w := range ws {
		rest += w
	}
	out := make([]rule, 0, len(eps)+2)
	dnat := func(to netip.AddrPort, mod, w uint32) rule {
		if affinity > 0 {
			return ruleDNATAffinitySet(f, proto, to, mod, w, affinity, affSet(to))
		}
		return ruleDNAT(f, proto, to, mod, w)
	}
	if affinity > 0 {
		out = slices.Grow(out, len(eps))
		for _, e := range eps {
			out = append(out, ruleAffinityCheck(f, proto, e.Addr, affSet(e.Addr), affinity))
		}
	}
	for i, e := range eps {
		w := ws[i]
		if i == len(eps)-1 {
			out = append(out, dnat(e.Addr, 0, 0))
			break
		}
		out = append(out, dnat(e.Addr, rest, w))
		rest -= w
	}
	if affinity > 0 {
		out = append(out, ruleDNAT(f, proto, eps[len(eps)-1].Addr, 0, 0))
	}
	return out
}

func gcd(a, b uint32) uint32 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// seal sets the chain's digest: a hash of its rules' texts, which is what
// partial syncs compare (the texts are the rules' identities).
func (c *chainSpec) seal() {
	h := sha256.New()
	for _, r := range c.rules {
		h.Write([]byte(r.text))
		h.Write([]byte{'\n'})
	}
	copy(c.digest[:], h.Sum(nil))
}

// String renders the unit as nft would list its chains and elements (in
// a stable order), for logs and tests.
func (u *unit) String() string {
	var b strings.Builder
	for _, c := range u.chains {
		fmt.Fprintf(&b, "chain %s {\n", c.name)
		for _, r := range c.rules {
			fmt.Fprintf(&b, "\t%s\n", r.text)
		}
		b.WriteString("}\n")
	}
	keys := make([]elemKey, 0, len(u.elems))
	for k := range u.elems {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, elemKey.compare)
	for _, k := range keys {
		switch {
		case k.end != "":
			fmt.Fprintf(&b, "element %s %x-%x\n", k.set, k.key, k.end)
		case k.set == setHairpin || k.set == setFirewallIPs || k.set == setNodePortIPs: // sets, not maps
			fmt.Fprintf(&b, "element %s %x\n", k.set, k.key)
		default:
			fmt.Fprintf(&b, "element %s %x : %s\n", k.set, k.key, verdictText(u.elems[k].kind, u.elems[k].chain))
		}
	}
	for _, k := range u.counted {
		fmt.Fprintf(&b, "%s %s\n", k.setName(), k.address())
	}
	return b.String()
}
