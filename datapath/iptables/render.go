package iptables

import (
	"crypto/sha256"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath"
)

// Tables edgeproxy writes to.
const (
	tableNAT    = "nat"
	tableFilter = "filter"
)

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
	// ClusterCIDRs are the pod ranges; traffic to a ClusterIP from outside
	// them is masqueraded. Empty: only MasqueradeAll decides.
	ClusterCIDRs []netip.Prefix
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

func (c *Config) markMasq() string {
	return fmt.Sprintf("0x%x", uint32(1)<<uint(c.MasqueradeBit))
}

func (c *Config) hostMask() string {
	if c.Family == datapath.IPv6 {
		return "/128"
	}
	return "/32"
}

// chain is one user chain and its rules, each a rule spec without "-A NAME".
type chain struct {
	table string
	name  string
	rules []string
}

// topRule is a rule a unit adds to one of the fixed chains.
type topRule struct {
	table, chain, spec string
}

// unit is everything one service port (one protocol) renders to: the chains
// it owns and its rules in the fixed dispatch chains. Units are the grain of
// partial syncs and of failure isolation.
type unit struct {
	id      string // Service + " " + protocol
	service string
	chains  []chain
	top     []topRule
	hairpin []netip.Addr // local endpoints, which may reach themselves
	digest  [32]byte
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

// render is Render with a cache: reuse may return the unit rendered for the
// same id before, which is then taken as is.
func render(cfg Config, frontends []datapath.Frontend, reuse func(id, service string) *unit) *Ruleset {
	rs := &Ruleset{cfg: cfg}
	byUnit := map[string][]*datapath.Frontend{}
	var ids []string
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
		id := f.Service + " " + strings.ToLower(string(f.Protocol))
		if _, ok := byUnit[id]; !ok {
			ids = append(ids, id)
		}
		byUnit[id] = append(byUnit[id], f)
	}
	slices.Sort(ids)
	for _, id := range ids {
		fs := byUnit[id]
		if reuse != nil {
			if u := reuse(id, fs[0].Service); u != nil {
				rs.units = append(rs.units, u)
				continue
			}
		}
		slices.SortFunc(fs, datapath.Compare)
		rs.units = append(rs.units, renderUnit(&rs.cfg, id, fs))
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

func groupSig(affinity time.Duration, eps []datapath.Endpoint) string {
	var b strings.Builder
	fmt.Fprintf(&b, "a=%d", affinity)
	for _, e := range eps {
		fmt.Fprintf(&b, " %s/%d", e.Addr, e.Weight)
	}
	return b.String()
}

func renderUnit(cfg *Config, id string, fs []*datapath.Frontend) *unit {
	ub := &unitBuilder{
		cfg: cfg, id: id, proto: strings.ToLower(string(fs[0].Protocol)),
		u:     &unit{id: id, service: fs[0].Service},
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
	ub.u.digest = unitDigest(ub.u)
	return ub.u
}

// extKey names an EXT chain: one per pair of groups (external,
// short-circuit).
type extKey struct{ g, sc *group }

// unitBuilder holds what renderUnit works out while rendering one unit.
type unitBuilder struct {
	cfg   *Config
	id    string
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
	return fmt.Sprintf("-m comment --comment %q", sanitize(f.Service)+" "+what)
}

// frontendMatch is the destination part of f's rules: "-d ADDR " (with the
// trailing space, empty for a NodePort without address) and the port match.
func (ub *unitBuilder) frontendMatch(f *datapath.Frontend) (dst, match string) {
	match = fmt.Sprintf("-p %s -m %s --dport %d", ub.proto, ub.proto, f.Port)
	if f.Addr.IsValid() {
		dst = "-d " + f.Addr.String() + ub.cfg.hostMask() + " "
	}
	return dst, match
}

// noEndpoints is the verdict for f when it has no endpoints: refused when
// there are none at all, dropped when a Local traffic policy keeps
// endpoints elsewhere from it (kube-proxy).
func noEndpoints(f *datapath.Frontend) (target, what string) {
	if f.Drop {
		return "DROP", " has no local endpoints"
	}
	return "REJECT", " has no endpoints"
}

func (ub *unitBuilder) addTop(table, chain, rule string) {
	ub.u.top = append(ub.u.top, topRule{table, chain, rule})
}

// frontendRules renders f's rules in the top chains, and its EXT and FW
// chains.
func (ub *unitBuilder) frontendRules(f *datapath.Frontend) {
	if f.Kind == datapath.ClusterIP {
		ub.clusterIPRules(f)
		return
	}
	// External frontends: NodePort, ExternalIP, LoadBalancer.
	dst, match := ub.frontendMatch(f)
	what := strings.ToLower(string(f.Kind))
	top := chainServices
	if f.Kind == datapath.NodePort {
		top = chainNodePorts
	}
	if extChain := ub.extChain(f); extChain != "" {
		ub.addTop(tableNAT, top, fmt.Sprintf("%s%s %s -j %s", dst, match, comment(f, what), extChain))
	}
	if len(f.Endpoints) == 0 {
		target, noWhat := noEndpoints(f)
		if f.Kind == datapath.NodePort {
			// Any local destination, whatever nodePortAddresses says,
			// as kube-proxy: unit rules must not depend on addresses.
			ub.addTop(tableFilter, chainExternal, fmt.Sprintf("-m addrtype --dst-type LOCAL %s %s -j %s", match, comment(f, what+noWhat), target))
		} else {
			// Arriving or routed traffic only, as kube-proxy's
			// KUBE-EXTERNAL-SERVICES: the node's own goes on its way.
			ub.addTop(tableFilter, chainExternal, fmt.Sprintf("%s%s %s -j %s", dst, match, comment(f, what+noWhat), target))
		}
	}
	if f.Kind == datapath.LoadBalancer && len(f.SourceRanges) > 0 && f.Addr.IsValid() {
		ub.firewallRules(f)
	}
}

func (ub *unitBuilder) clusterIPRules(f *datapath.Frontend) {
	dst, match := ub.frontendMatch(f)
	if len(f.Endpoints) == 0 {
		target, noWhat := noEndpoints(f)
		ub.addTop(tableFilter, chainServices, fmt.Sprintf("%s%s %s -j %s", dst, match, comment(f, "cluster IP"+noWhat), target))
		return
	}
	if ub.cfg.MasqueradeAll {
		ub.addTop(tableNAT, chainServices, fmt.Sprintf("%s%s %s -j %s", dst, match, comment(f, "cluster IP"), chainMarkMasq))
	} else if len(ub.cfg.ClusterCIDRs) > 0 {
		ub.addTop(tableNAT, chainServices, fmt.Sprintf("%s%s %s -j %s", dst, match, comment(f, "cluster IP"), chainClusterMasq))
	}
	ub.addTop(tableNAT, chainServices, fmt.Sprintf("%s%s %s -j %s", dst, match, comment(f, "cluster IP"), ub.groupOf[f].svc))
}

// extChain returns the EXT chain of an external frontend, rendering it the
// first time its pair of groups is seen; "" when it would be empty.
func (ub *unitBuilder) extChain(f *datapath.Frontend) string {
	g, sc := ub.groupOf[f], ub.shortCircuit[f]
	if name, ok := ub.ext[extKey{g, sc}]; ok {
		return name
	}
	var rules []string
	if f.LocalOnly {
		rules = ub.localExtRules(f, g, sc)
	} else if len(g.endpoints) > 0 {
		rules = append(rules, "-j "+chainMarkMasq, "-j "+g.svc)
	}
	name := ""
	if len(rules) > 0 {
		name = ChainName(kindExt, g.svc)
		ub.u.chains = append(ub.u.chains, chain{tableNAT, name, rules})
	}
	ub.ext[extKey{g, sc}] = name
	return name
}

// localExtRules is kube-proxy's short-circuit: pods (by clusterCIDR) and
// the node itself reach the cluster-wide set sc; the node's traffic is
// masqueraded, its source being a local address (often the very address
// it reaches). Everyone else reaches the local endpoints g.
func (ub *unitBuilder) localExtRules(f *datapath.Frontend, g, sc *group) []string {
	var rules []string
	if sc != nil {
		for _, c := range ub.cfg.ClusterCIDRs {
			rules = append(rules, fmt.Sprintf("-s %s -m comment --comment \"pod traffic for %s goes to the cluster\" -j %s", c.Masked(), sanitize(f.Service), sc.svc))
		}
	}
	if sc != nil || len(g.endpoints) > 0 {
		rules = append(rules, "-m addrtype --src-type LOCAL -j "+chainMarkMasq)
	}
	if sc != nil {
		rules = append(rules, "-m addrtype --src-type LOCAL -j "+sc.svc)
	}
	if len(g.endpoints) > 0 {
		rules = append(rules, "-j "+g.svc)
	}
	return rules
}

// firewallRules renders a load balancer's FW chain (its source ranges)
// and the rule that leads to it.
func (ub *unitBuilder) firewallRules(f *datapath.Frontend) {
	fw := ChainName(kindFw, ub.id+" "+f.AddrString())
	var rules []string
	for _, r := range f.SourceRanges {
		if datapath.FamilyOf(r.Addr()) == ub.cfg.Family {
			rules = append(rules, "-s "+r.Masked().String()+" -j RETURN")
		}
	}
	rules = append(rules, fmt.Sprintf("-m comment --comment %q -j DROP", sanitize(f.Service)+" source not in loadBalancerSourceRanges"))
	ub.u.chains = append(ub.u.chains, chain{tableFilter, fw, rules})
	ub.addTop(tableFilter, chainFirewall,
		fmt.Sprintf("-m conntrack --ctorigdst %s --ctorigdstport %d --ctproto %s %s -j %s", f.Addr, f.Port, ub.proto, comment(f, "source ranges"), fw))
}

// unitDigest is the digest of a unit's chains as written.
func unitDigest(u *unit) [32]byte {
	h := sha256.New()
	for _, c := range u.chains {
		fmt.Fprintf(h, "%s %s\n", c.table, c.name)
		for _, r := range c.rules {
			fmt.Fprintf(h, "%s\n", r)
		}
	}
	var d [32]byte
	copy(d[:], h.Sum(nil))
	return d
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
	var svc []string
	if secs > 0 {
		seps = make([]string, len(g.endpoints))
		for i, e := range g.endpoints {
			seps[i] = ChainName(kindSep, g.svc+" "+e.Addr.String())
			svc = append(svc, fmt.Sprintf("-m recent --name %s --rcheck --seconds %d --reap -j %s", seps[i], secs, seps[i]))
		}
	}
	target := func(i int) string {
		if seps != nil {
			return "-j " + seps[i]
		}
		return "-j DNAT --to-destination " + g.endpoints[i].Addr.String()
	}
	// Rule i is taken with probability w_i / sum(w_j, j >= i), which makes
	// the overall chance of endpoint i exactly w_i / sum(w).
	var rest uint64
	for _, e := range g.endpoints {
		rest += uint64(e.Weight)
	}
	for i, e := range g.endpoints {
		if i == len(g.endpoints)-1 {
			svc = append(svc, fmt.Sprintf("-p %s %s", proto, target(i)))
			break
		}
		p := float64(e.Weight) / float64(rest)
		rest -= uint64(e.Weight)
		svc = append(svc, fmt.Sprintf("-p %s -m statistic --mode random --probability %s %s", proto, formatProbability(p), target(i)))
	}
	for _, e := range g.endpoints {
		if e.Local {
			u.hairpin = append(u.hairpin, e.Addr.Addr())
		}
	}
	out := []chain{{tableNAT, g.svc, svc}}
	for i, e := range g.endpoints {
		if seps == nil {
			break
		}
		out = append(out, chain{tableNAT, seps[i], []string{
			fmt.Sprintf("-p %s -m recent --name %s --set --rsource -j DNAT --to-destination %s", proto, seps[i], e.Addr),
		}})
	}
	return out
}

func formatProbability(p float64) string {
	return strconv.FormatFloat(p, 'f', 10, 64)
}

// nodePortDst returns the destination matches that select node-port
// addresses, one rule each.
func nodePortDst(cfg *Config) []string {
	if cfg.NodePortIPs == nil {
		switch {
		case cfg.Family == datapath.IPv6:
			return []string{"-m addrtype --dst-type LOCAL ! -d ::1/128 "}
		case !cfg.LocalhostNodePorts:
			return []string{"-m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 "}
		}
		return []string{"-m addrtype --dst-type LOCAL "}
	}
	var out []string
	for _, a := range cfg.NodePortIPs {
		if datapath.FamilyOf(a) != cfg.Family || a.IsLoopback() && (cfg.Family == datapath.IPv6 || !cfg.LocalhostNodePorts) {
			continue
		}
		out = append(out, "-d "+a.Unmap().String()+cfg.hostMask()+" ")
	}
	return out
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '"' || r == '\\' || r < ' ' || r > '~' {
			return '_'
		}
		return r
	}, s)
}

// fixedChains lists the chains that exist regardless of the plan, per table.
var fixedChains = map[string][]string{
	tableNAT:    {chainServices, chainNodePorts, chainPostrouting, chainHairpin, chainMarkMasq, chainClusterMasq, chainCanary},
	tableFilter: {chainServices, chainExternal, chainFirewall, chainForward, chainLocalnet, chainNodePorts, chainCanary},
}

// canaryRule is the single rule of the canary chains. A flush of the table
// removes it; Tampered looks for it.
const canaryRule = `-m comment --comment "edgeproxy canary" -j RETURN`

// staticRules returns the fixed chains' rules that do not depend on the
// plan: head rules come before the units' rules, tail rules after.
func staticRules(cfg *Config) (head, tail []topRule) {
	mark := cfg.markMasq()
	masq := "-j MASQUERADE"
	if cfg.RandomFully {
		masq += " --random-fully"
	}
	head = []topRule{
		{tableNAT, chainMarkMasq, "-j MARK --or-mark " + mark},
		{tableNAT, chainPostrouting, "-m conntrack --ctstate DNAT -j " + chainHairpin},
		{tableNAT, chainPostrouting, fmt.Sprintf("-m mark ! --mark %s/%s -j RETURN", mark, mark)},
		{tableNAT, chainPostrouting, "-j MARK --xor-mark " + mark},
		{tableNAT, chainPostrouting, `-m comment --comment "edgeproxy service traffic requiring SNAT" ` + masq},
		{tableNAT, chainCanary, canaryRule},
		{tableFilter, chainForward, fmt.Sprintf(`-m mark --mark %s/%s -m comment --comment "edgeproxy forwarding rules" -j ACCEPT`, mark, mark)},
		{tableFilter, chainForward, `-m conntrack --ctstate RELATED,ESTABLISHED -m comment --comment "edgeproxy forwarding conntrack rule" -j ACCEPT`},
		{tableFilter, chainCanary, canaryRule},
	}
	if !cfg.TCPBeLiberal {
		// Out-of-window packets would reset connections; with
		// tcp_be_liberal the kernel takes them instead (kube-proxy).
		head = slices.Insert(head, 0, topRule{tableFilter, chainForward,
			`-m conntrack --ctstate INVALID -m comment --comment "edgeproxy: out-of-window packets must not reset connections" -j DROP`})
	}
	if cfg.Family == datapath.IPv4 && cfg.LocalhostNodePorts {
		// route_localnet lets packets to 127.0.0.0/8 arrive from outside
		// (CVE-2020-8558); only those DNATed to a NodePort may pass, like
		// kube-proxy's (and kubelet's) KUBE-FIREWALL rule.
		head = append(head, topRule{tableFilter, chainLocalnet,
			`-d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -m comment --comment "edgeproxy: block incoming localnet connections" -j DROP`})
	}
	for _, p := range cfg.HealthCheckPorts {
		head = append(head, topRule{tableFilter, chainNodePorts,
			fmt.Sprintf(`-p tcp -m tcp --dport %d -m comment --comment "edgeproxy health check node port" -j ACCEPT`, p)})
	}
	for _, c := range cfg.ClusterCIDRs {
		head = append(head, topRule{tableNAT, chainClusterMasq, "-s " + c.Masked().String() + " -j RETURN"})
	}
	head = append(head, topRule{tableNAT, chainClusterMasq, "-j " + chainMarkMasq})
	for _, d := range nodePortDst(cfg) {
		tail = append(tail, topRule{tableNAT, chainServices, strings.TrimSpace(d) + ` -m comment --comment "edgeproxy node ports; keep last" -j ` + chainNodePorts})
	}
	return head, tail
}

// jump is a rule in a built-in chain that leads to one of ours.
type jump struct {
	table, chain string
	spec         []string
}

// jumps is the static skeleton: where packets enter our chains. IPv6 has
// no localnet martians to drop (no route_localnet).
func jumps(fam datapath.Family) []jump {
	newOnly := []string{"-m", "conntrack", "--ctstate", "NEW"}
	j := func(table, from string, cond []string, to, why string) jump {
		spec := slices.Concat(cond, []string{"-m", "comment", "--comment", "edgeproxy " + why, "-j", to})
		return jump{table, from, spec}
	}
	out := []jump{
		j(tableNAT, "PREROUTING", nil, chainServices, "service portals"),
		j(tableNAT, "OUTPUT", nil, chainServices, "service portals"),
		j(tableNAT, "POSTROUTING", nil, chainPostrouting, "postrouting rules"),
		j(tableFilter, "INPUT", newOnly, chainServices, "service portals"),
		j(tableFilter, "INPUT", newOnly, chainExternal, "node ports"),
		j(tableFilter, "INPUT", newOnly, chainFirewall, "load balancer firewall"),
		j(tableFilter, "FORWARD", newOnly, chainServices, "service portals"),
		j(tableFilter, "FORWARD", newOnly, chainExternal, "external service portals"),
		j(tableFilter, "FORWARD", newOnly, chainFirewall, "load balancer firewall"),
		j(tableFilter, "FORWARD", nil, chainForward, "forwarding rules"),
		j(tableFilter, "OUTPUT", newOnly, chainServices, "service portals"),
		j(tableFilter, "OUTPUT", newOnly, chainFirewall, "load balancer firewall"),
		j(tableFilter, "INPUT", nil, chainNodePorts, "health check node ports"),
	}
	if fam == datapath.IPv4 {
		out = append(out,
			j(tableFilter, "INPUT", nil, chainLocalnet, "localnet martians"),
			j(tableFilter, "OUTPUT", nil, chainLocalnet, "localnet martians"))
	}
	return out
}

// obsoleteJumps are jumps earlier versions wrote and this one does not:
// removed on the first apply and by cleanup, so that they neither linger
// nor keep our chains busy.
func obsoleteJumps() []jump {
	return []jump{{tableFilter, "OUTPUT", []string{"-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "edgeproxy node ports", "-j", chainExternal}}}
}

// joinSpec renders split rule arguments back into restore syntax, quoting
// the ones with spaces (comments).
func joinSpec(spec []string) string {
	parts := make([]string, len(spec))
	for i, a := range spec {
		if strings.ContainsAny(a, " \t") {
			a = `"` + a + `"`
		}
		parts[i] = a
	}
	return strings.Join(parts, " ")
}

// tableChain names a chain in a table.
type tableChain struct{ table, name string }

// writeSpec says what one restore writes: the fixed chains, the chains of
// the units in write, and the stale chains to delete.
type writeSpec struct {
	write map[string]bool // unit ids; nil means all
	stale []tableChain
	// fixed holds the digests of the fixed chains as last written; with
	// write set, fixed chains whose digest is unchanged are left out.
	fixed map[tableChain][32]byte
	// jumps from built-in chains to insert (at the top, in jumps() order).
	jumps []jump
}

// chains returns the set of chains the ruleset owns beyond the fixed ones.
func (rs *Ruleset) chains() map[tableChain]string {
	out := map[tableChain]string{}
	for _, u := range rs.units {
		for _, c := range u.chains {
			out[tableChain{c.table, c.name}] = u.id
		}
	}
	return out
}

// drop removes a unit from the ruleset, after the kernel refused its rules.
// serviceOf returns the service port of unit id.
func (rs *Ruleset) serviceOf(id string) string {
	for _, u := range rs.units {
		if u.id == id {
			return u.service
		}
	}
	return id
}

func (rs *Ruleset) drop(id string) {
	rs.units = slices.DeleteFunc(rs.units, func(u *unit) bool { return u.id == id })
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
func (rs *Ruleset) RestoreText() string {
	t, _, _ := rs.restoreText(writeSpec{})
	return string(t)
}

// Services returns the ids of the rendered units ("namespace/name:port proto").
func (rs *Ruleset) Services() []string {
	out := make([]string, len(rs.units))
	for i, u := range rs.units {
		out[i] = u.id
	}
	return out
}
