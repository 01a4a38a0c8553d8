package iptables

import (
	"crypto/sha256"
	"fmt"
	"hash"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// tables lists the tables iptables mode writes, in the order written.
var tables = [...]string{xtables.Filter, xtables.NAT}

// newTransaction starts a transaction over tables whose objects are owned
// by units.
func newTransaction() *xtables.Transaction[*unitID] {
	return xtables.NewTransaction[*unitID](tables[:]...)
}

func tableIndex(table string) int {
	if table == xtables.NAT {
		return 1
	}
	return 0
}

// maxAffinity is the longest ClientIP affinity timeout rendered; longer
// ones are clamped, as Kubernetes caps timeoutSeconds at one day.
const maxAffinity = 24 * time.Hour

// Config is everything rule rendering needs besides the plan: the settings
// that shape the rules of one IP family. Render is a pure function of a
// Config and a list of frontends.
type Config struct {
	Family datapath.Family
	// MasqueradeBit is the bit of the packet mark that asks for SNAT (0..31).
	MasqueradeBit int
	// MasqueradeAll marks every packet sent to a ClusterIP.
	MasqueradeAll bool
	// ClusterCIDRs tell traffic from pods by its source: the first range
	// of the family (kube-proxy's local-traffic detector, modes
	// ClusterCIDR and NodeCIDR). Traffic to a ClusterIP from elsewhere
	// is masqueraded, and pods reach a Local external frontend's
	// cluster-wide endpoints. None (and no PodInterface): no traffic is
	// told from pods, only MasqueradeAll marks ClusterIP traffic.
	ClusterCIDRs []netip.Prefix
	// PodInterface tells traffic from pods by the interface it arrives
	// on instead (-i; a trailing "+" matches every interface whose name
	// begins with the rest): kube-proxy's BridgeInterface and
	// InterfaceNamePrefix modes. ClusterCIDRs are then not used.
	PodInterface string
	// NodePortIPs restricts NodePorts to these destination addresses: the
	// node's own addresses inside nodePortAddresses, as kube-proxy matches
	// them. Nil: every local address (addrtype LOCAL); empty but not nil:
	// no address matched, no node ports in this family.
	NodePortIPs []netip.Addr
	// LocalhostNodePorts lets NodePorts answer on 127.0.0.0/8 (IPv4 only).
	LocalhostNodePorts bool
	// RandomFully adds --random-fully to the MASQUERADE rule.
	RandomFully bool
	// TCPBeLiberal leaves out the rule that drops INVALID packets.
	TCPBeLiberal bool
	// HealthCheckPorts are accepted in filter INPUT (the Services'
	// healthCheckNodePorts), as kube-proxy's filter KUBE-NODEPORTS.
	HealthCheckPorts []uint16
}

func (c *Config) markMasq() uint32 { return uint32(1) << uint(c.MasqueradeBit) }

// fromPods is the match that tells traffic from pods (kube-proxy's
// LocalTrafficDetector.IfLocal); false when nothing tells it.
func (c *Config) fromPods() (xtables.Match, bool) {
	if c.PodInterface != "" {
		return xtables.InIface(c.PodInterface), true
	}
	for _, p := range c.ClusterCIDRs {
		if datapath.FamilyOf(p.Addr()) == c.Family {
			return xtables.Src(p.Masked()), true
		}
	}
	return xtables.Match{}, false
}

// chain is one user chain and its rules.
type chain struct {
	table string
	name  string
	rules []xtables.Rule
}

// topRule is a rule a unit adds to one of the fixed chains.
type topRule struct {
	table, chain string
	rule         xtables.Rule
}

// digest is what is kept of rules between syncs instead of their text.
type digest [16]byte

// unitID identifies a unit: a service port and a protocol.
type unitID struct {
	service datapath.ServicePortName
	proto   datapath.Protocol
}

// String is "namespace/name:port proto", the form chain names are hashed
// from (ChainName) and errors show.
func (id unitID) String() string {
	n, proto := &id.service, lowerProto(id.proto)
	if n.Port == "" {
		return n.Namespace + "/" + n.Name + " " + proto
	}
	return n.Namespace + "/" + n.Name + ":" + n.Port + " " + proto
}

// lowerProto is p as iptables writes it ("tcp"), without allocating for
// the protocols a plan may hold.
func lowerProto(p datapath.Protocol) string {
	switch p {
	case datapath.TCP:
		return "tcp"
	case datapath.UDP:
		return "udp"
	case datapath.SCTP:
		return "sctp"
	}
	return strings.ToLower(string(p))
}

// unitOf is the id of the unit frontend f belongs to.
func unitOf(f *datapath.Frontend) unitID { return unitID{f.Service, f.Protocol} }

// compare orders ids as their String forms order (no name holds a byte
// below the space that separates the protocol).
func (id unitID) compare(o unitID) int {
	if c := id.service.Compare(o.service); c != 0 {
		return c
	}
	return strings.Compare(string(id.proto), string(o.proto))
}

// unit is everything one service port (one protocol) renders to: the chains
// it owns and its rules in the fixed dispatch chains. Units are the grain of
// partial syncs and of failure isolation.
//
// Between syncs only a summary is kept (see summary): names, hairpin and
// digests, without chains and top. A summary is never written; a sync that
// needs its rules renders it again.
type unit struct {
	id        unitID
	chains    []chain
	top       []topRule
	names     []xtables.Chain    // the chains it owns
	hairpin   []netip.Addr       // local endpoints, which may reach themselves
	digest    digest             // of chains as written
	topDigest digest             // of top
	rules     [len(tables)]int32 // rules in chains and top, per table (tables order)
	input     inputSum           // of what it was rendered from
	summary   bool               // chains and top left out
}

// summarize returns what is kept of u between syncs.
func (u *unit) summarize() *unit {
	return &unit{id: u.id, names: u.names, hairpin: u.hairpin, digest: u.digest, topDigest: u.topDigest, rules: u.rules, input: u.input, summary: true}
}

// Ruleset is the rendered form of a plan for one family.
type Ruleset struct {
	cfg   Config
	units []*unit // sorted by id
	// Errors lists frontends left out because they cannot be rendered.
	Errors []error
}

// Render turns the frontends of cfg.Family into a Ruleset. Frontends of
// other families are ignored. Frontends that cannot be rendered are left
// out and reported in Ruleset.Errors; the rest is unaffected.
func Render(cfg Config, frontends []datapath.Frontend) *Ruleset {
	return render(cfg, frontends, nil)
}

// reuseFunc may return the summary of the unit written for the same id
// before (unit.summarize); in hashes what the unit would be rendered from
// (its inputSum), for a caller that reuses only an unchanged input.
type reuseFunc func(id unitID, in func() inputSum) *unit

// render is Render with a cache: a summary that reuse returns is taken as
// is: its digests and chain names, without rules.
func render(cfg Config, frontends []datapath.Frontend, reuse reuseFunc) *Ruleset {
	rs := &Ruleset{cfg: cfg}
	all := make([]*datapath.Frontend, 0, len(frontends))
	for i := range frontends {
		f := &frontends[i]
		if f.Family != cfg.Family {
			continue
		}
		f = unmapped(f)
		if err := datapath.CheckFrontend(f); err != nil {
			rs.Errors = append(rs.Errors, &datapath.PortError{Service: f.Service, Err: fmt.Errorf("iptables: %w", err)})
			continue
		}
		all = append(all, f)
	}
	// Group by unit: sort by unit id (a plan comes sorted by service
	// already), then take each run of one id.
	slices.SortStableFunc(all, func(a, b *datapath.Frontend) int { return unitOf(a).compare(unitOf(b)) })
	cs := configSum(&rs.cfg)
	for len(all) > 0 {
		id, n := unitOf(all[0]), 1
		for n < len(all) && unitOf(all[n]) == id {
			n++
		}
		fs := all[:n:n]
		all = all[n:]
		sorted := false
		in := func() inputSum {
			if !sorted {
				slices.SortFunc(fs, datapath.Compare)
				sorted = true
			}
			return sumInput(cs, fs)
		}
		if reuse != nil {
			if u := reuse(id, in); u != nil {
				rs.units = append(rs.units, u)
				continue
			}
		}
		sum := in()
		u := renderUnit(&rs.cfg, id, fs)
		u.input = sum
		rs.units = append(rs.units, u)
	}
	return rs
}

// unmapped returns f with IPv4-mapped IPv6 addresses written as IPv4,
// copying it only when needed (the plan is never modified).
func unmapped(f *datapath.Frontend) *datapath.Frontend {
	mapped := f.Addr.Is4In6()
	for _, e := range slices.Concat(f.Endpoints, f.Cluster) {
		mapped = mapped || e.Addr.Addr().Is4In6()
	}
	if !mapped {
		return f
	}
	c := *f
	c.Addr = c.Addr.Unmap()
	c.Endpoints, c.Cluster = unmapEndpoints(f.Endpoints), unmapEndpoints(f.Cluster)
	return &c
}

func unmapEndpoints(eps []datapath.Endpoint) []datapath.Endpoint {
	if eps == nil {
		return nil
	}
	out := make([]datapath.Endpoint, len(eps))
	for i, e := range eps {
		e.Addr = netip.AddrPortFrom(e.Addr.Addr().Unmap(), e.Addr.Port())
		out[i] = e
	}
	return out
}

// renderHook, when set (by tests only), may change a unit after rendering.
var renderHook func(u *unit)

// group is a set of frontends of one unit that share their endpoints and
// affinity, and so one SVC chain.
type group struct {
	svc       string
	sig       string
	endpoints []datapath.Endpoint
	affinity  time.Duration
	frontends []*datapath.Frontend
}

// groupSig identifies an endpoint set with its affinity ("a=NS ADDR:PORT/WEIGHT...").
func groupSig(affinity time.Duration, eps []datapath.Endpoint) string {
	b := make([]byte, 0, 24+28*len(eps))
	b = strconv.AppendInt(append(b, "a="...), int64(affinity), 10)
	for _, e := range eps {
		b, _ = e.Addr.AppendText(append(b, ' '))
		b = strconv.AppendUint(append(b, '/'), uint64(e.Weight), 10)
	}
	return string(b)
}

func renderUnit(cfg *Config, id unitID, fs []*datapath.Frontend) *unit {
	ub := &unitBuilder{
		cfg: cfg, id: id.String(), proto: lowerProto(id.proto),
		u:     &unit{id: id},
		bySig: map[string]*group{}, names: map[string]bool{},
		groupOf: map[*datapath.Frontend]*group{}, shortCircuit: map[*datapath.Frontend]*group{},
		ext: map[extKey]string{},
	}
	ub.groupFrontends(fs)
	for _, g := range ub.groups {
		if len(g.endpoints) > 0 {
			ub.u.chains = append(ub.u.chains, renderGroup(cfg, ub.u, g, ub.proto)...)
		}
	}
	for _, f := range fs {
		ub.frontendRules(f)
	}
	if renderHook != nil {
		renderHook(ub.u)
	}
	ub.u.seal()
	return ub.u
}

// extKey names an EXT chain: one per pair of groups (external,
// short-circuit).
type extKey struct{ g, sc *group }

// unitBuilder holds what renderUnit works out while rendering one unit.
type unitBuilder struct {
	cfg   *Config
	id    string // the unit's id as ChainName hashes it
	proto string
	u     *unit

	groups       []*group
	bySig        map[string]*group
	names        map[string]bool
	groupOf      map[*datapath.Frontend]*group
	shortCircuit map[*datapath.Frontend]*group // the cluster-wide group a Local frontend short-circuits pod and node traffic to; often the ClusterIP's own group
	ext          map[extKey]string
}

// groupFrontends groups the frontends by endpoint set.
func (ub *unitBuilder) groupFrontends(fs []*datapath.Frontend) {
	for _, f := range fs {
		role := "cluster"
		if f.Kind.External() {
			role = "external"
			if f.LocalOnly {
				role = "local"
			}
		}
		g := ub.groupFor(f, f.Endpoints, role)
		g.frontends = append(g.frontends, f)
		ub.groupOf[f] = g
		if f.LocalOnly && f.Kind.External() && len(f.Cluster) > 0 {
			ub.shortCircuit[f] = ub.groupFor(f, f.Cluster, "cluster")
		}
	}
}

// groupFor returns the group of endpoint set eps, new or shared. The SVC
// chain name depends on the group's role, not on its endpoints, so an
// endpoint change rewrites the same chain instead of renaming it.
func (ub *unitBuilder) groupFor(f *datapath.Frontend, eps []datapath.Endpoint, role string) *group {
	sig := groupSig(f.Affinity, eps)
	if g := ub.bySig[sig]; g != nil {
		return g
	}
	name := ChainName(kindSvc, ub.id+" "+role)
	if ub.names[name] {
		name = ChainName(kindSvc, ub.id+" "+role+" "+string(f.Kind)+" "+f.AddrString())
	}
	ub.names[name] = true
	g := &group{svc: name, sig: sig, endpoints: eps, affinity: min(f.Affinity, maxAffinity)}
	ub.bySig[sig] = g
	ub.groups = append(ub.groups, g)
	return g
}

func comment(f *datapath.Frontend, what string) string {
	return sanitize(f.Service.String()) + " " + what
}

// frontendMatch is the destination part of f's rules: its address (none
// for a NodePort without address) and its port.
func (ub *unitBuilder) frontendMatch(f *datapath.Frontend) []xtables.Match {
	if f.Addr.IsValid() {
		return []xtables.Match{xtables.DstHost(f.Addr), xtables.DPort(ub.proto, f.Port)}
	}
	return []xtables.Match{xtables.DPort(ub.proto, f.Port)}
}

// noEndpoints is the verdict for f when it has no endpoints: refused when
// there are none at all, dropped when a Local traffic policy keeps
// endpoints elsewhere from it (kube-proxy).
func noEndpoints(f *datapath.Frontend) (xtables.Target, string) {
	if f.Drop {
		return xtables.Drop, " has no local endpoints"
	}
	return xtables.Reject, " has no endpoints"
}

func (ub *unitBuilder) addTop(table, chain string, r xtables.Rule) {
	ub.u.top = append(ub.u.top, topRule{table, chain, r})
}

// frontendRules renders f's rules in the top chains, and its EXT and FW
// chains.
func (ub *unitBuilder) frontendRules(f *datapath.Frontend) {
	if f.Kind == datapath.ClusterIP {
		ub.clusterIPRules(f)
		return
	}
	// External frontends: NodePort, ExternalIP, LoadBalancer.
	ms := ub.frontendMatch(f)
	what := strings.ToLower(string(f.Kind))
	top := chainServices
	if f.Kind == datapath.NodePort {
		top = chainNodePorts
	}
	if extChain := ub.extChain(f); extChain != "" {
		ub.addTop(xtables.NAT, top, xtables.Rule{Matches: ms, Comment: comment(f, what), Target: xtables.JumpTo(extChain)})
	}
	if len(f.Endpoints) == 0 {
		target, noWhat := noEndpoints(f)
		if f.Kind == datapath.NodePort {
			// Any local destination, whatever nodePortAddresses says,
			// as kube-proxy: unit rules must not depend on addresses.
			ms = []xtables.Match{xtables.DstLocal(), xtables.DPort(ub.proto, f.Port)}
		}
		// Otherwise arriving or routed traffic only, as kube-proxy's
		// KUBE-EXTERNAL-SERVICES: the node's own goes on its way.
		ub.addTop(xtables.Filter, chainExternal, xtables.Rule{Matches: ms, Comment: comment(f, what+noWhat), Target: target})
	}
	if f.Kind == datapath.LoadBalancer && len(f.SourceRanges) > 0 && f.Addr.IsValid() {
		ub.firewallRules(f)
	}
}

func (ub *unitBuilder) clusterIPRules(f *datapath.Frontend) {
	ms := ub.frontendMatch(f)
	if len(f.Endpoints) == 0 {
		target, noWhat := noEndpoints(f)
		ub.addTop(xtables.Filter, chainServices, xtables.Rule{Matches: ms, Comment: comment(f, "cluster IP"+noWhat), Target: target})
		return
	}
	if ub.cfg.MasqueradeAll {
		ub.addTop(xtables.NAT, chainServices, xtables.Rule{Matches: ms, Comment: comment(f, "cluster IP"), Target: xtables.JumpTo(chainMarkMasq)})
	} else if _, ok := ub.cfg.fromPods(); ok {
		ub.addTop(xtables.NAT, chainServices, xtables.Rule{Matches: ms, Comment: comment(f, "cluster IP"), Target: xtables.JumpTo(chainClusterMasq)})
	}
	ub.addTop(xtables.NAT, chainServices, xtables.Rule{Matches: ms, Comment: comment(f, "cluster IP"), Target: xtables.JumpTo(ub.groupOf[f].svc)})
}

// extChain returns the EXT chain of an external frontend, rendering it the
// first time its pair of groups is seen; "" when it would be empty.
func (ub *unitBuilder) extChain(f *datapath.Frontend) string {
	g, sc := ub.groupOf[f], ub.shortCircuit[f]
	if name, ok := ub.ext[extKey{g, sc}]; ok {
		return name
	}
	var rules []xtables.Rule
	if f.LocalOnly {
		rules = ub.localExtRules(f, g, sc)
	} else if len(g.endpoints) > 0 {
		rules = append(rules, xtables.Rule{Target: xtables.JumpTo(chainMarkMasq)}, xtables.Rule{Target: xtables.JumpTo(g.svc)})
	}
	name := ""
	if len(rules) > 0 {
		name = ChainName(kindExt, g.svc)
		ub.u.chains = append(ub.u.chains, chain{xtables.NAT, name, rules})
	}
	ub.ext[extKey{g, sc}] = name
	return name
}

// localExtRules is kube-proxy's short-circuit: pods (as Config.fromPods
// tells them) and the node itself reach the cluster-wide set sc; the
// node's traffic is masqueraded, its source being a local address (often
// the very address it reaches). Everyone else reaches the local
// endpoints g.
func (ub *unitBuilder) localExtRules(f *datapath.Frontend, g, sc *group) []xtables.Rule {
	var rules []xtables.Rule
	if pods, ok := ub.cfg.fromPods(); ok && sc != nil {
		rules = append(rules, xtables.Rule{Matches: []xtables.Match{pods}, Comment: "pod traffic for " + sanitize(f.Service.String()) + " goes to the cluster", Target: xtables.JumpTo(sc.svc)})
	}
	local := []xtables.Match{xtables.SrcLocal()}
	if sc != nil || len(g.endpoints) > 0 {
		rules = append(rules, xtables.Rule{Matches: local, Target: xtables.JumpTo(chainMarkMasq)})
	}
	if sc != nil {
		rules = append(rules, xtables.Rule{Matches: local, Target: xtables.JumpTo(sc.svc)})
	}
	if len(g.endpoints) > 0 {
		rules = append(rules, xtables.Rule{Target: xtables.JumpTo(g.svc)})
	}
	return rules
}

// firewallRules renders a load balancer's FW chain (its source ranges)
// and the rule that leads to it.
func (ub *unitBuilder) firewallRules(f *datapath.Frontend) {
	fw := ChainName(kindFw, ub.id+" "+f.AddrString())
	var rules []xtables.Rule
	for _, r := range f.SourceRanges {
		if datapath.FamilyOf(r.Addr()) == ub.cfg.Family {
			rules = append(rules, xtables.Rule{Matches: []xtables.Match{xtables.Src(r.Masked())}, Target: xtables.Return})
		}
	}
	if f.SourceRangesHoldNode {
		// The node's own requests, looped back by a balancer whose
		// address is local, come from that address.
		rules = append(rules, xtables.Rule{Matches: []xtables.Match{xtables.Src(netip.PrefixFrom(f.Addr, f.Addr.BitLen()))}, Target: xtables.Return})
	}
	rules = append(rules, xtables.Rule{Comment: comment(f, "source not in loadBalancerSourceRanges"), Target: xtables.Drop})
	ub.u.chains = append(ub.u.chains, chain{xtables.Filter, fw, rules})
	ub.addTop(xtables.Filter, chainFirewall,
		xtables.Rule{Matches: []xtables.Match{xtables.CtOrigDst(f.Addr, f.Port, ub.proto)}, Comment: comment(f, "source ranges"), Target: xtables.JumpTo(fw)})
}

// seal records the chains' names and the digests of a rendered unit.
func (u *unit) seal() {
	h := digesters.Get().(*digester)
	defer digesters.Put(h)
	u.names = make([]xtables.Chain, len(u.chains))
	for i, c := range u.chains {
		u.names[i] = xtables.Chain{Table: c.table, Name: c.name}
		u.rules[tableIndex(c.table)] += int32(len(c.rules))
		h.str(c.table, " ", c.name, "\n")
		h.rules(c.rules)
	}
	u.digest = h.sum()
	for _, t := range u.top {
		u.rules[tableIndex(t.table)]++
		h.str(t.table, " ", t.chain, "\n")
		h.rule(&t.rule)
	}
	u.topDigest = h.sum()
}

// digesters are reused across units: a digester's hash and buffer are
// worth keeping.
var digesters = sync.Pool{New: func() any { return new(digester) }}

// digester hashes rules in their digest form (Rule.AppendDigest), through a
// buffer (no allocation per string).
type digester struct {
	h hash.Hash
	b []byte
}

func (d *digester) flush(force bool) {
	if d.h == nil {
		d.h = sha256.New()
	}
	if force || len(d.b) > 32<<10 {
		d.h.Write(d.b)
		d.b = d.b[:0]
	}
}

func (d *digester) str(ss ...string) {
	for _, s := range ss {
		d.b = append(d.b, s...)
	}
	d.flush(false)
}

func (d *digester) rule(r *xtables.Rule) {
	d.b = r.AppendDigest(d.b)
	d.b = append(d.b, '\n')
	d.flush(false)
}

func (d *digester) rules(rs []xtables.Rule) {
	for i := range rs {
		d.rule(&rs[i])
	}
}

// sum returns the digest of what was written and starts anew.
func (d *digester) sum() digest {
	d.flush(true)
	var out digest
	copy(out[:], d.h.Sum(d.b[:0]))
	d.h.Reset()
	return out
}

// renderGroup writes a group's SVC chain: one DNAT rule per endpoint,
// chosen by a cascade of statistic matches. With ClientIP affinity each
// endpoint gets a SEP chain that records the client in a recent list
// before the DNAT, and the SVC chain first sends known clients back to
// their endpoint. Hairpin traffic is masqueraded in EP-HAIRPIN, so
// endpoints need no chain of their own otherwise: one chain per service
// port keeps iptables-nft-restore fast.
func renderGroup(cfg *Config, u *unit, g *group, proto string) []chain {
	secs := int64(g.affinity / time.Second)
	if g.affinity > 0 && secs == 0 {
		secs = 1
	}
	var seps []string
	var svc []xtables.Rule
	if secs > 0 {
		seps = make([]string, len(g.endpoints))
		for i, e := range g.endpoints {
			seps[i] = ChainName(kindSep, g.svc+" "+e.Addr.String())
			svc = append(svc, xtables.Rule{Matches: []xtables.Match{xtables.RecentSeen(seps[i], secs)}, Target: xtables.JumpTo(seps[i])})
		}
	}
	target := func(i int) xtables.Target {
		if seps != nil {
			return xtables.JumpTo(seps[i])
		}
		return xtables.DNAT(g.endpoints[i].Addr)
	}
	// Rule i is taken with probability w_i / sum(w_j, j >= i), which makes
	// the overall chance of endpoint i exactly w_i / sum(w).
	var rest uint64
	for _, e := range g.endpoints {
		rest += uint64(e.Weight)
	}
	for i, e := range g.endpoints {
		if i == len(g.endpoints)-1 {
			svc = append(svc, xtables.Rule{Matches: []xtables.Match{xtables.Proto(proto)}, Target: target(i)})
			break
		}
		p := float64(e.Weight) / float64(rest)
		rest -= uint64(e.Weight)
		svc = append(svc, xtables.Rule{Matches: []xtables.Match{xtables.Proto(proto), xtables.Probability(p)}, Target: target(i)})
	}
	for _, e := range g.endpoints {
		if e.Local {
			u.hairpin = append(u.hairpin, e.Addr.Addr())
		}
	}
	out := []chain{{xtables.NAT, g.svc, svc}}
	for i, e := range g.endpoints {
		if seps == nil {
			break
		}
		out = append(out, chain{xtables.NAT, seps[i], []xtables.Rule{
			{Matches: []xtables.Match{xtables.Proto(proto), xtables.RecentSet(seps[i])}, Target: xtables.DNAT(e.Addr)},
		}})
	}
	return out
}

func appendProbability(b []byte, p float64) []byte {
	return strconv.AppendFloat(b, p, 'f', 10, 64)
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '"' || r == '\\' || r < ' ' || r > '~' {
			return '_'
		}
		return r
	}, s)
}

// writeSpec says what one restore writes: the fixed chains, the chains of
// the units in write, and the stale chains to delete.
type writeSpec struct {
	write map[unitID]bool // nil means all
	stale []xtables.Chain
	// fixed holds the digests of the fixed chains as last written; with
	// write set, fixed chains whose digest is unchanged are left out.
	fixed map[xtables.Chain]digest
	// keepFixed (with write set) says the fixed chains are unchanged
	// (see Ruleset.fixedSum): none is rendered or written.
	keepFixed bool
	// jumps from built-in chains to insert (at the top, in jumps() order).
	jumps []xtables.Jump
}

// chains returns the set of chains the ruleset owns beyond the fixed ones.
func (rs *Ruleset) chains() map[xtables.Chain]bool {
	out := map[xtables.Chain]bool{}
	for _, u := range rs.units {
		for _, c := range u.names {
			out[c] = true
		}
	}
	return out
}

// dropAll removes the units in ids from the ruleset, after the kernel
// refused their rules.
func (rs *Ruleset) dropAll(ids map[unitID]bool) {
	if len(ids) > 0 {
		rs.units = slices.DeleteFunc(rs.units, func(u *unit) bool { return ids[u.id] })
	}
}

// summaries reports whether some units are summaries (taken from the last
// sync without their rules).
func (rs *Ruleset) summaries() bool {
	return slices.ContainsFunc(rs.units, func(u *unit) bool { return u.summary })
}

// fixedSum is the digest of everything the fixed chains are made of: the
// static rules, each unit's rules in them and the hairpin addresses. While
// it stays the same, so do the fixed chains, and a partial sync can leave
// them alone without rendering them (nor the units it did not render).
func (rs *Ruleset) fixedSum() digest {
	var d digester
	head, tail := staticRules(&rs.cfg)
	for _, r := range slices.Concat(head, tail) {
		d.str(r.table, " ", r.chain, "\n")
		d.rule(&r.rule)
	}
	for _, u := range rs.units {
		d.str(u.id.service.Namespace, "/", u.id.service.Name, ":", u.id.service.Port, " ", string(u.id.proto), "\n")
		d.str(string(u.topDigest[:]))
	}
	for _, a := range rs.hairpin() {
		d.str(a.String(), "\n")
	}
	return d.sum()
}

// hairpin returns the local endpoint addresses of all units, sorted and
// without duplicates.
func (rs *Ruleset) hairpin() []netip.Addr {
	var out []netip.Addr
	for _, u := range rs.units {
		out = append(out, u.hairpin...)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// RestoreText is the complete iptables-restore --noflush input that
// programs the ruleset from scratch (a full sync with nothing stale). It is
// what the golden tests compare.
func (rs *Ruleset) RestoreText() (string, error) {
	t, _, _, err := rs.restoreText(writeSpec{})
	return string(t), err
}

// Services returns the ids of the rendered units ("namespace/name:port proto").
func (rs *Ruleset) Services() []string {
	out := make([]string, len(rs.units))
	for i, u := range rs.units {
		out[i] = u.id.String()
	}
	return out
}
