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
)

var (
	natChains    = []string{chainServices, chainNodePort, chainMarkMasq, chainClusterMasq, chainPostrouting}
	filterChains = []string{chainFilter, chainForward}
)

// ruleConfig is what the static rules depend on.
type ruleConfig struct {
	Family        datapath.Family // the sets matched are this family's
	ClusterCIDRs  []netip.Prefix  // those of other families are ignored
	MasqueradeAll bool
	MarkBit       int
}

func (c ruleConfig) mark() string { m := 1 << c.MarkBit; return fmt.Sprintf("%#x/%#x", m, m) }

// renderRules returns the iptables-restore input for our chains. Declaring
// a chain in a --noflush restore replaces its rules, so applying this text
// is idempotent and repairs edits. Its size depends on the configuration
// only, never on the plan.
func renderRules(c ruleConfig) string {
	var b strings.Builder
	mark := c.mark()
	orMark := fmt.Sprintf("%#x", 1<<c.MarkBit)
	r := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	set := func(base string) string { return setName(base, c.Family) }

	r("*nat")
	for _, ch := range natChains {
		r(":%s - [0:0]", ch)
	}
	r("-A %s -j MARK --or-mark %s", chainMarkMasq, orMark)
	r(`-A %s -m set --match-set %s dst,dst,src -m comment --comment "edgeproxy hairpin" -j MASQUERADE`, chainPostrouting, set(setLoopback))
	r("-A %s -m mark ! --mark %s -j RETURN", chainPostrouting, mark)
	r("-A %s -j MARK --xor-mark %s", chainPostrouting, orMark)
	r(`-A %s -m comment --comment "edgeproxy service traffic requiring SNAT" -j MASQUERADE`, chainPostrouting)
	// ClusterIP traffic is masqueraded when it comes from outside the
	// cluster ranges (so that replies return through this node), or
	// always with masqueradeAll.
	var cidrs []netip.Prefix
	for _, p := range c.ClusterCIDRs {
		if datapath.FamilyOf(p.Addr()) == c.Family {
			cidrs = append(cidrs, p.Masked())
		}
	}
	if !c.MasqueradeAll {
		for _, p := range cidrs {
			r("-A %s -s %s -j RETURN", chainClusterMasq, p)
		}
	}
	r("-A %s -j %s", chainClusterMasq, chainMarkMasq)
	if c.MasqueradeAll || len(cidrs) > 0 {
		r("-A %s -m set --match-set %s dst,dst -j %s", chainServices, set(setClusterIP), chainClusterMasq)
	}
	r("-A %s -m set --match-set %s dst,dst -j %s", chainServices, set(setExternalIP), chainMarkMasq)
	r("-A %s -m set --match-set %s dst,dst -j %s", chainServices, set(setLB), chainMarkMasq)
	r("-A %s -m addrtype --dst-type LOCAL -j %s", chainServices, chainNodePort)
	for _, p := range protocols {
		lp := strings.ToLower(string(p))
		r("-A %s -p %s -m set --match-set %s dst -j RETURN", chainNodePort, lp, set(setNodePortLoPfx+string(p)))
		r("-A %s -p %s -m set --match-set %s dst -j %s", chainNodePort, lp, set(setNodePortPfx+string(p)), chainMarkMasq)
	}
	r("COMMIT")
	r("*filter")
	for _, ch := range filterChains {
		r(":%s - [0:0]", ch)
	}
	r(`-A %s -m set --match-set %s dst,dst -m comment --comment "edgeproxy service without endpoints" -j REJECT`, chainFilter, set(setNoEndpoints))
	r(`-A %s -m set --match-set %s dst,dst -m comment --comment "edgeproxy local service without local endpoints" -j DROP`, chainFilter, set(setNoEndpointsLo))
	r(`-A %s -m set --match-set %s dst,dst -m set ! --match-set %s dst,dst,src -m comment --comment "edgeproxy load balancer source ranges" -j DROP`, chainFilter, set(setLBFirewall), set(setLBSource))
	r(`-A %s -m conntrack --ctstate INVALID -j DROP`, chainForward)
	r(`-A %s -m comment --comment "edgeproxy service traffic" -m mark --mark %s -j ACCEPT`, chainForward, mark)
	r(`-A %s -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`, chainForward)
	r("COMMIT")
	return b.String()
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
		j("filter", "INPUT", newOnly, "filter", chainFilter),
		j("filter", "OUTPUT", newOnly, "filter", chainFilter),
		j("filter", "FORWARD", newOnly, "filter", chainFilter),
		j("filter", "FORWARD", nil, "forward", chainForward),
	}
}

// iptables writes our static rules with the shared xtables driver (the
// same backend detection, lock wait and restore as iptables mode).
type iptables struct {
	x   *xtables.Tool // nil with a fake Kernel (unit tests): every call fails
	fam datapath.Family
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
		for table, chains := range map[string][]string{"nat": natChains, "filter": filterChains} {
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
