package ipvs

import (
	"context"
	"fmt"
	"net/netip"
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
	ClusterCIDRs  []netip.Prefix  // those of other families are ignored
	MasqueradeAll bool
	MarkBit       int
	RandomFully   bool // MASQUERADE --random-fully (iptables 1.6.2 and later)
}

func (c ruleConfig) mark() string { m := 1 << c.MarkBit; return fmt.Sprintf("%#x/%#x", m, m) }

// renderRules returns the iptables-restore input for our chains. Declaring
// a chain in a --noflush restore replaces its rules, so applying this text
// is idempotent and repairs edits. Its size depends on the configuration
// only, never on the plan.
func renderRules(c ruleConfig) string {
	var b strings.Builder
	w := ruleWriter{c: c, b: &b}
	w.nat()
	w.filter()
	w.mangle()
	return b.String()
}

// ruleWriter writes the tables of renderRules.
type ruleWriter struct {
	c ruleConfig
	b *strings.Builder
}

func (w ruleWriter) r(format string, args ...any) { fmt.Fprintf(w.b, format+"\n", args...) }

// set is base's set name in the rules' family.
func (w ruleWriter) set(base string) string { return setName(base, w.c.Family) }

// cidrs are the cluster ranges of the rules' family.
func (c ruleConfig) cidrs() []netip.Prefix {
	var out []netip.Prefix
	for _, p := range c.ClusterCIDRs {
		if datapath.FamilyOf(p.Addr()) == c.Family {
			out = append(out, p.Masked())
		}
	}
	return out
}

func (w ruleWriter) nat() {
	c, r, set := w.c, w.r, w.set
	mark, orMark := c.mark(), fmt.Sprintf("%#x", 1<<c.MarkBit)
	r("*nat")
	for _, ch := range natChains {
		r(":%s - [0:0]", ch)
	}
	r("-A %s -j MARK --or-mark %s", chainMarkMasq, orMark)
	r(`-A %s -m set --match-set %s dst,dst,src -m comment --comment "edgeproxy hairpin" -j MASQUERADE`, chainPostrouting, set(setLoopback))
	r("-A %s -m mark ! --mark %s -j RETURN", chainPostrouting, mark)
	r("-A %s -j MARK --xor-mark %s", chainPostrouting, orMark)
	masq := "MASQUERADE"
	if c.RandomFully {
		masq += " --random-fully"
	}
	r(`-A %s -m comment --comment "edgeproxy service traffic requiring SNAT" -j %s`, chainPostrouting, masq)
	// ClusterIP traffic is masqueraded when it comes from outside the
	// cluster ranges (so that replies return through this node), or
	// always with masqueradeAll.
	cidrs := c.cidrs()
	if !c.MasqueradeAll {
		for _, p := range cidrs {
			r("-A %s -s %s -j RETURN", chainClusterMasq, p)
		}
	}
	r("-A %s -j %s", chainClusterMasq, chainMarkMasq)
	if c.MasqueradeAll || len(cidrs) > 0 {
		r("-A %s -m set --match-set %s dst,dst -j %s", chainServices, set(setClusterIP), chainClusterMasq)
	} else {
		// Without cluster ranges pods cannot be told from the outside;
		// as kube-proxy, masquerade only what the node sends from a
		// service address (the source the kernel picks to reach an
		// address bound on the dummy link).
		r("-A %s -m set --match-set %s src,dst -j %s", chainServices, set(setClusterIP), chainMarkMasq)
	}
	r("-A %s -m set --match-set %s dst,dst -j %s", chainServices, set(setExternalIP), chainMarkMasq)
	r("-A %s -m set --match-set %s dst,dst -j %s", chainServices, set(setLB), chainMarkMasq)
	// The node reaching an external address of policy Local: its source
	// would be the address itself (bound on the dummy link), which a pod
	// on another node cannot answer.
	for _, s := range []string{setExternalLocal, setLBLocal} {
		r("-A %s -m set --match-set %s dst,dst -m addrtype --src-type LOCAL -j %s", chainServices, set(s), chainMarkMasq)
	}
	r("-A %s -m addrtype --dst-type LOCAL -j %s", chainServices, chainNodePort)
	for _, p := range protocols {
		lp, match, suffix := strings.ToLower(string(p)), "dst", ""
		if p == datapath.SCTP {
			match, suffix = "dst,dst", "-HASH" // hash:ip,port: (node address, port)
		}
		r("-A %s -p %s -m set --match-set %s %s -j RETURN", chainNodePort, lp, set(setNodePortLoPfx+string(p)+suffix), match)
		r("-A %s -p %s -m set --match-set %s %s -j %s", chainNodePort, lp, set(setNodePortPfx+string(p)+suffix), match, chainMarkMasq)
	}
	r("COMMIT")
}

func (w ruleWriter) filter() {
	c, r, set := w.c, w.r, w.set
	mark := c.mark()
	r("*filter")
	for _, ch := range filterChains {
		r(":%s - [0:0]", ch)
	}
	r(`-A %s -m set --match-set %s dst,dst -m comment --comment "edgeproxy service without endpoints" -j REJECT`, chainFilter, set(setNoEndpoints))
	// Policy Local without local endpoints: pods (sources in the cluster
	// ranges) and the node itself use the cluster-wide endpoints, the
	// rest is dropped.
	r(`-A %s -m set --match-set %s dst,dst -m addrtype --src-type LOCAL -j RETURN`, chainFilter, set(setNoEndpointsLo))
	for _, p := range c.cidrs() {
		r(`-A %s -m set --match-set %s dst,dst -s %s -j RETURN`, chainFilter, set(setNoEndpointsLo), p)
	}
	r(`-A %s -m set --match-set %s dst,dst -m comment --comment "edgeproxy local service without local endpoints" -j DROP`, chainFilter, set(setNoEndpointsLo))
	r(`-A %s -m set --match-set %s dst,dst -m set ! --match-set %s dst,dst,src -m comment --comment "edgeproxy load balancer source ranges" -j DROP`, chainFilter, set(setLBFirewall), set(setLBSource))
	// A service address is bound on the dummy link, so the node's own
	// sockets on 0.0.0.0 would answer on it: arriving at a service
	// address, only service ports and healthCheckNodePorts get in
	// (kube-proxy's KUBE-IPVS-FILTER, kubernetes#72236).
	for _, s := range []string{setLB, setLBLocal, setClusterIP, setExternalIP, setExternalLocal} {
		r("-A %s -m set --match-set %s dst,dst -j RETURN", chainHostFilter, set(s))
	}
	r("-A %s -m set --match-set %s dst -j RETURN", chainHostFilter, set(setHealthCheck))
	r(`-A %s -m set --match-set %s dst -m comment --comment "edgeproxy other ports of service addresses" -j REJECT`, chainHostFilter, set(setVIPs))
	r(`-A %s -m conntrack --ctstate INVALID -j DROP`, chainForward)
	r(`-A %s -m comment --comment "edgeproxy service traffic" -m mark --mark %s -j ACCEPT`, chainForward, mark)
	r(`-A %s -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`, chainForward)
	r("COMMIT")
}

func (w ruleWriter) mangle() {
	r, set := w.r, w.set
	// IPVS rewrites the node's own packets at LOCAL_OUT, before filter
	// OUTPUT sees them; load balancer source ranges for the node are
	// checked in mangle OUTPUT, which comes first (kube-proxy's
	// KUBE-IPVS-OUT-FILTER, kubernetes#119656, with `-m ipvs` per
	// service instead).
	r("*mangle")
	for _, ch := range mangleChains {
		r(":%s - [0:0]", ch)
	}
	r(`-A %s -m set --match-set %s dst,dst -m set ! --match-set %s dst,dst,src -m comment --comment "edgeproxy load balancer source ranges, node" -j DROP`, chainOutFilter, set(setLBFirewall), set(setLBSource))
	r("COMMIT")
}

// jump is a rule in a built-in chain that leads into ours.
type jump struct {
	table, chain string
	spec         []string
}

func jumps() []jump {
	c := func(why string) []string { return []string{"-m", "comment", "--comment", "edgeproxy-ipvs " + why} }
	newOnly := []string{"-m", "conntrack", "--ctstate", "NEW"}
	j := func(table, chain string, cond []string, why, to string) jump {
		spec := append(append(append([]string{}, cond...), c(why)...), "-j", to)
		return jump{table, chain, spec}
	}
	return []jump{
		j("nat", "PREROUTING", nil, "services", chainServices),
		j("nat", "OUTPUT", nil, "services", chainServices),
		j("nat", "POSTROUTING", nil, "postrouting", chainPostrouting),
		j("filter", "INPUT", newOnly, "host filter", chainHostFilter),
		j("filter", "INPUT", newOnly, "filter", chainFilter),
		j("filter", "OUTPUT", newOnly, "filter", chainFilter),
		j("filter", "FORWARD", newOnly, "filter", chainFilter),
		j("filter", "FORWARD", nil, "forward", chainForward),
		j("mangle", "OUTPUT", newOnly, "out filter", chainOutFilter),
	}
}

// iptables writes our static rules with the shared xtables driver (the
// same backend detection, lock wait and restore as iptables mode).
type iptables struct {
	x           *xtables.Tool // nil with a fake Kernel (unit tests): every call fails
	fam         datapath.Family
	randomFully bool // the tools know MASQUERADE --random-fully
}

func (t iptables) run(ctx context.Context, args ...string) (string, error) {
	out, err := t.x.Run(ctx, args...)
	if err != nil {
		return out, fmt.Errorf("ipvs: %w", err)
	}
	return out, nil
}

// ensure writes our chains and makes sure every jump exists.
func (t iptables) ensure(ctx context.Context, text string) error {
	if err := t.x.RestoreNoFlush(ctx, []byte(text)); err != nil {
		return fmt.Errorf("ipvs: %w", err)
	}
	for _, j := range jumps() {
		args := append([]string{"-t", j.table, "-C", j.chain}, j.spec...)
		if _, err := t.run(ctx, args...); err == nil {
			continue
		}
		args = append([]string{"-t", j.table, "-I", j.chain, "1"}, j.spec...)
		if _, err := t.run(ctx, args...); err != nil {
			return err
		}
	}
	return nil
}

// remove deletes the jumps and our chains; missing ones are fine.
func (t iptables) remove(ctx context.Context) error {
	for _, j := range jumps() {
		for range 10 { // a jump inserted twice is removed twice; bounded
			args := append([]string{"-t", j.table, "-D", j.chain}, j.spec...)
			if _, err := t.run(ctx, args...); err != nil {
				break
			}
		}
	}
	var firstErr error
	// Flush every chain first: a chain still referred to cannot go.
	for _, pass := range []string{"-F", "-X"} {
		for table, chains := range map[string][]string{"nat": natChains, "filter": filterChains, "mangle": mangleChains} {
			for _, ch := range chains {
				if _, err := t.run(ctx, "-t", table, "-n", "-L", ch); err != nil {
					continue // not there
				}
				if _, err := t.run(ctx, "-t", table, pass, ch); err != nil && firstErr == nil {
					firstErr = err
				}
			}
		}
	}
	return firstErr
}

// countRules returns how many rules the tables hold in our chains and the
// jumps into them, as iptables-save reports them.
func (t iptables) countRules(ctx context.Context) (int, error) {
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
