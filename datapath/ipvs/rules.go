package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// Chains. The rules in them match the sets, never single services, so
// their number does not grow with the number of services.
const (
	chainServices    = "EP-IPVS-SERVICES"     // nat PREROUTING, OUTPUT: mark what needs SNAT
	chainNodePort    = "EP-IPVS-NODE-PORT"    // nat: NodePort marking
	chainMarkMasq    = "EP-IPVS-MARK-MASQ"    // nat: set the masquerade bit
	chainPostrouting = "EP-IPVS-POSTROUTING"  // nat POSTROUTING: hairpin and marked SNAT
	chainClusterMasq = "EP-IPVS-CLUSTER-MASQ" // nat: mark sources outside the cluster ranges
	chainFilter      = "EP-IPVS-FILTER"       // filter INPUT, OUTPUT, FORWARD (new): no endpoints, source ranges
	chainForward     = "EP-IPVS-FORWARD"      // filter FORWARD: accept service traffic
	chainHostFilter  = "EP-IPVS-HOST-FILTER"  // filter INPUT (new): other ports of a service address refused
	chainOutFilter   = "EP-IPVS-OUT-FILTER"   // mangle OUTPUT (new): the node's own packets, before IPVS rewrites them
)

var (
	natChains    = []string{chainServices, chainNodePort, chainMarkMasq, chainClusterMasq, chainPostrouting}
	filterChains = []string{chainFilter, chainForward, chainHostFilter}
	mangleChains = []string{chainOutFilter}
)

// ruleConfig is what the static rules depend on.
type ruleConfig struct {
	Family        datapath.Family // the sets matched are this family's
	ClusterCIDRs  []netip.Prefix  // tell pods by source: the first of the family; others are ignored
	PodInterface  string          // tell pods by input interface instead (-i; "veth+" by prefix)
	MasqueradeAll bool
	MarkBit       int
	RandomFully   bool // MASQUERADE --random-fully (iptables 1.6.2 and later)
}

func (c ruleConfig) mark() uint32 { return uint32(1) << uint(c.MarkBit) }

// noOwner: the static rules belong to no service, so the transaction's
// lines have no owner to blame.
type noOwner struct{}

// renderRules returns the iptables-restore input for our chains. Declaring
// a chain in a --noflush restore replaces its rules, so applying this text
// is idempotent and repairs edits. Its size depends on the configuration
// only, never on the plan. An error is a rule the typed model refuses.
func renderRules(c ruleConfig) (string, error) {
	w := ruleWriter{c: c, tx: xtables.NewTransaction[noOwner](xtables.NAT, xtables.Filter, xtables.Mangle)}
	w.nat()
	w.filter()
	w.mangle()
	text, _, err := w.tx.Render()
	if err != nil {
		return "", fmt.Errorf("ipvs: %w", err)
	}
	return string(text), nil
}

// ruleWriter writes the tables of renderRules.
type ruleWriter struct {
	c  ruleConfig
	tx *xtables.Transaction[noOwner]
}

// declare declares the chains of table.
func (w ruleWriter) declare(table string, chains []string) {
	for _, ch := range chains {
		w.tx.Declare(noOwner{}, xtables.Chain{Table: table, Name: ch})
	}
}

// r appends a rule to chain (in the nat, filter or mangle table, as
// the chain's name says).
func (w ruleWriter) r(chain string, r xtables.Rule) {
	w.tx.Add(noOwner{}, xtables.Chain{Table: tableOf(chain), Name: chain}, &r)
}

// tableOf is the table chain lives in.
func tableOf(chain string) string {
	switch {
	case slices.Contains(natChains, chain):
		return xtables.NAT
	case slices.Contains(mangleChains, chain):
		return xtables.Mangle
	}
	return xtables.Filter
}

// set matches base's set (of the rules' family) in directions dirs.
func (w ruleWriter) set(base, dirs string) xtables.Match {
	return xtables.InSet(setName(base, w.c.Family), dirs)
}

// fromPods is the match that tells traffic from pods (kube-proxy's
// local-traffic detector): the interface it arrives on, or the first
// range of the rules' family; false when nothing tells it.
func (c ruleConfig) fromPods() (xtables.Match, bool) {
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

// ms lists matches.
func ms(ms ...xtables.Match) []xtables.Match { return ms }

func (w ruleWriter) nat() {
	c, r, set := w.c, w.r, w.set
	type rule = xtables.Rule
	w.declare(xtables.NAT, natChains)
	r(chainMarkMasq, rule{Target: xtables.MarkOr(c.mark())})
	r(chainPostrouting, rule{Matches: ms(set(setLoopback, "dst,dst,src")), Comment: "edgeproxy hairpin", Target: xtables.Masquerade(false)})
	r(chainPostrouting, rule{Matches: ms(xtables.NotMark(c.mark())), Target: xtables.Return})
	r(chainPostrouting, rule{Target: xtables.MarkXor(c.mark())})
	r(chainPostrouting, rule{Comment: "edgeproxy service traffic requiring SNAT", Target: xtables.Masquerade(c.RandomFully)})
	// ClusterIP traffic is masqueraded when it does not come from pods
	// (so that replies return through this node), or always with
	// masqueradeAll.
	pods, podsTold := c.fromPods()
	if !c.MasqueradeAll && podsTold {
		r(chainClusterMasq, rule{Matches: ms(pods), Target: xtables.Return})
	}
	r(chainClusterMasq, rule{Target: xtables.JumpTo(chainMarkMasq)})
	if c.MasqueradeAll || podsTold {
		r(chainServices, rule{Matches: ms(set(setClusterIP, "dst,dst")), Target: xtables.JumpTo(chainClusterMasq)})
	} else {
		// When nothing tells pods from the outside;
		// as kube-proxy, masquerade only what the node sends from a
		// service address (the source the kernel picks to reach an
		// address bound on the dummy link).
		r(chainServices, rule{Matches: ms(set(setClusterIP, "src,dst")), Target: xtables.JumpTo(chainMarkMasq)})
	}
	r(chainServices, rule{Matches: ms(set(setExternalIP, "dst,dst")), Target: xtables.JumpTo(chainMarkMasq)})
	r(chainServices, rule{Matches: ms(set(setLB, "dst,dst")), Target: xtables.JumpTo(chainMarkMasq)})
	// The node reaching an external address of policy Local: its source
	// would be the address itself (bound on the dummy link), which a pod
	// on another node cannot answer.
	for _, s := range []string{setExternalLocal, setLBLocal} {
		r(chainServices, rule{Matches: ms(set(s, "dst,dst"), xtables.SrcLocal()), Target: xtables.JumpTo(chainMarkMasq)})
	}
	r(chainServices, rule{Matches: ms(xtables.DstLocal()), Target: xtables.JumpTo(chainNodePort)})
	for _, p := range protocols {
		lp, dirs, suffix := strings.ToLower(string(p)), "dst", ""
		if p == datapath.SCTP {
			dirs, suffix = "dst,dst", "-HASH" // hash:ip,port: (node address, port)
		}
		r(chainNodePort, rule{Matches: ms(xtables.Proto(lp), set(setNodePortLoPfx+string(p)+suffix, dirs)), Target: xtables.Return})
		r(chainNodePort, rule{Matches: ms(xtables.Proto(lp), set(setNodePortPfx+string(p)+suffix, dirs)), Target: xtables.JumpTo(chainMarkMasq)})
	}
}

func (w ruleWriter) filter() {
	c, r, set := w.c, w.r, w.set
	type rule = xtables.Rule
	w.declare(xtables.Filter, filterChains)
	r(chainFilter, rule{Matches: ms(set(setNoEndpoints, "dst,dst")), Comment: "edgeproxy service without endpoints", Target: xtables.Reject})
	// Policy Local without local endpoints: pods (fromPods) and the node
	// itself use the cluster-wide endpoints, the rest is dropped.
	r(chainFilter, rule{Matches: ms(set(setNoEndpointsLo, "dst,dst"), xtables.SrcLocal()), Target: xtables.Return})
	if pods, ok := c.fromPods(); ok {
		// The address or interface first, where iptables-save puts it.
		r(chainFilter, rule{Matches: ms(pods, set(setNoEndpointsLo, "dst,dst")), Target: xtables.Return})
	}
	r(chainFilter, rule{Matches: ms(set(setNoEndpointsLo, "dst,dst")), Comment: "edgeproxy local service without local endpoints", Target: xtables.Drop})
	r(chainFilter, rule{Matches: ms(set(setLBFirewall, "dst,dst"), xtables.NotInSet(setName(setLBSource, c.Family), "dst,dst,src")), Comment: "edgeproxy load balancer source ranges", Target: xtables.Drop})
	// A service address is bound on the dummy link, so the node's own
	// sockets on 0.0.0.0 would answer on it: arriving at a service
	// address, only service ports and healthCheckNodePorts get in
	// (kube-proxy's KUBE-IPVS-FILTER, kubernetes#72236).
	for _, s := range []string{setLB, setLBLocal, setClusterIP, setExternalIP, setExternalLocal} {
		r(chainHostFilter, rule{Matches: ms(set(s, "dst,dst")), Target: xtables.Return})
	}
	r(chainHostFilter, rule{Matches: ms(set(setHealthCheck, "dst")), Target: xtables.Return})
	r(chainHostFilter, rule{Matches: ms(set(setVIPs, "dst")), Comment: "edgeproxy other ports of service addresses", Target: xtables.Reject})
	r(chainForward, rule{Matches: ms(xtables.CtState("INVALID")), Target: xtables.Drop})
	r(chainForward, rule{Matches: ms(xtables.Mark(c.mark())), Comment: "edgeproxy service traffic", Target: xtables.Accept})
	r(chainForward, rule{Matches: ms(xtables.CtState("RELATED,ESTABLISHED")), Target: xtables.Accept})
}

func (w ruleWriter) mangle() {
	// IPVS rewrites the node's own packets at LOCAL_OUT, before filter
	// OUTPUT sees them; load balancer source ranges for the node are
	// checked in mangle OUTPUT, which comes first (kube-proxy's
	// KUBE-IPVS-OUT-FILTER, kubernetes#119656, with `-m ipvs` per
	// service instead).
	w.declare(xtables.Mangle, mangleChains)
	w.r(chainOutFilter, xtables.Rule{Matches: ms(w.set(setLBFirewall, "dst,dst"), xtables.NotInSet(setName(setLBSource, w.c.Family), "dst,dst,src")), Comment: "edgeproxy load balancer source ranges, node", Target: xtables.Drop})
}

// jumps are the rules in built-in chains that lead into ours.
func jumps() []xtables.Jump {
	newOnly := []xtables.Match{xtables.CtState("NEW")}
	j := func(table, chain string, cond []xtables.Match, why, to string) xtables.Jump {
		return xtables.Jump{Table: table, Chain: chain, Rule: xtables.Rule{Matches: cond, Comment: "edgeproxy-ipvs " + why, Target: xtables.JumpTo(to)}}
	}
	return []xtables.Jump{
		j(xtables.NAT, "PREROUTING", nil, "services", chainServices),
		j(xtables.NAT, "OUTPUT", nil, "services", chainServices),
		j(xtables.NAT, "POSTROUTING", nil, "postrouting", chainPostrouting),
		j(xtables.Filter, "INPUT", newOnly, "host filter", chainHostFilter),
		j(xtables.Filter, "INPUT", newOnly, "filter", chainFilter),
		j(xtables.Filter, "OUTPUT", newOnly, "filter", chainFilter),
		j(xtables.Filter, "FORWARD", newOnly, "filter", chainFilter),
		j(xtables.Filter, "FORWARD", nil, "forward", chainForward),
		j(xtables.Mangle, "OUTPUT", newOnly, "out filter", chainOutFilter),
	}
}

// tool is what the static rules need of the iptables tools:
// *xtables.Tool, or an *xtables.Fake in unit tests.
type tool interface {
	Run(ctx context.Context, args ...string) (string, error)
	RestoreNoFlush(ctx context.Context, text []byte) error
	SaveTable(ctx context.Context, table string) (string, error)
}

// errNoTool is what every call returns when no tool was opened.
var errNoTool = errors.New("ipvs: no iptables tool opened")

// iptables writes our static rules with the shared xtables driver (the
// same backend detection, lock wait and restore as iptables mode).
type iptables struct {
	x           tool // nil with a fake Kernel (unit tests): every call fails
	fam         datapath.Family
	randomFully bool // the tools know MASQUERADE --random-fully
}

func (t iptables) run(ctx context.Context, args ...string) (string, error) {
	if t.x == nil {
		return "", errNoTool
	}
	out, err := t.x.Run(ctx, args...)
	if err != nil {
		return out, fmt.Errorf("ipvs: %w", err)
	}
	return out, nil
}

// ensure writes our chains (text, from renderRules) and makes sure every jump exists.
func (t iptables) ensure(ctx context.Context, text string) error {
	if t.x == nil {
		return errNoTool
	}
	if err := t.x.RestoreNoFlush(ctx, []byte(text)); err != nil {
		return fmt.Errorf("ipvs: %w", err)
	}
	for _, j := range jumps() {
		args := append([]string{"-t", j.Table, "-C", j.Chain}, j.Rule.Args()...)
		if _, err := t.run(ctx, args...); err == nil {
			continue
		}
		args = append([]string{"-t", j.Table, "-I", j.Chain, "1"}, j.Rule.Args()...)
		if _, err := t.run(ctx, args...); err != nil {
			return err
		}
	}
	return nil
}

// remove deletes the jumps and our chains; missing ones are fine. It is
// one iptables-save and one iptables-restore --noflush (each table one
// transaction), not a run of iptables per rule and chain: under an
// emulated CPU those cost a second or so each.
func (t iptables) remove(ctx context.Context) error {
	if t.x == nil {
		return nil // no tool, nothing of ours to remove
	}
	saved, err := t.x.SaveTable(ctx, "")
	if err != nil {
		return fmt.Errorf("ipvs: %w", err)
	}
	var b strings.Builder
	for _, table := range []string{xtables.NAT, xtables.Filter, xtables.Mangle} {
		b.WriteString(removal(table, saved))
	}
	if b.Len() == 0 {
		return nil
	}
	if err := t.x.RestoreNoFlush(ctx, []byte(b.String())); err != nil {
		return fmt.Errorf("ipvs: %w", err)
	}
	return nil
}

// removal is the iptables-restore --noflush input that removes our chains
// from table, read from saved (iptables-save's listing): every rule of
// another chain that jumps to one of them is deleted as listed, then the
// chains are flushed and deleted. "" when the table holds none.
func removal(table, saved string) string {
	ours := map[string]bool{}
	for _, c := range slices.Concat(natChains, filterChains, mangleChains) {
		ours[c] = true
	}
	var present []string
	var dels strings.Builder
	in := false
	for _, l := range strings.Split(saved, "\n") {
		switch {
		case strings.HasPrefix(l, "*"):
			in = l[1:] == table
		case !in:
		case strings.HasPrefix(l, ":"):
			if name, _, _ := strings.Cut(l[1:], " "); ours[name] {
				present = append(present, name)
			}
		case strings.HasPrefix(l, "-A "):
			chain, spec, _ := strings.Cut(l[3:], " ")
			if !ours[chain] && ours[jumpTarget(spec)] {
				dels.WriteString("-D " + chain + " " + spec + "\n")
			}
		}
	}
	if len(present) == 0 && dels.Len() == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("*" + table + "\n")
	b.WriteString(dels.String())
	for _, c := range present {
		b.WriteString(":" + c + " - [0:0]\n")
	}
	for _, c := range present {
		b.WriteString("-X " + c + "\n")
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// jumpTarget is the chain a listed rule jumps or goes to, "" for other
// targets.
func jumpTarget(spec string) string {
	f := strings.Fields(spec)
	for i := len(f) - 2; i >= 0; i-- {
		if f[i] == "-j" || f[i] == "-g" {
			return f[i+1]
		}
	}
	return ""
}

// countRules returns how many rules the tables hold in our chains and the
// jumps into them, as iptables-save reports them.
func (t iptables) countRules(ctx context.Context) (int, error) {
	if t.x == nil {
		return 0, errNoTool
	}
	out, err := t.x.SaveTable(ctx, "")
	if err != nil {
		return 0, fmt.Errorf("ipvs: %w", err)
	}
	n := 0
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "-A ") && strings.Contains(line, "EP-IPVS-") {
			n++
		}
	}
	return n, nil
}
