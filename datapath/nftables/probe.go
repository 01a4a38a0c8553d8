package nftables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/google/nftables"

	"github.com/edgeproxy/edgeproxy/datapath"
)

// ErrKernelSupport is wrapped by Probe's error when the kernel refuses an
// object or expression nftables mode uses; the error names each one.
var ErrKernelSupport = errors.New("nftables: the kernel lacks what nftables mode needs")

// probeTable is the throwaway table of Probe's transactions: created and
// deleted in the same transaction, so it is never committed.
const probeTable = "edgeproxy-probe"

// feature is one kind of expression the datapath writes, in a rule of
// the probe's regular chain.
type feature struct {
	name string
	rule rule
}

// features are the expressions the datapath uses in family f's table,
// each in a rule written as the datapath writes it.
func (f *fam) features(bit uint32) []feature {
	to := netip.MustParseAddrPort("10.0.0.1:80")
	if f.family == datapath.IPv6 {
		to = netip.MustParseAddrPort("[fd00::1]:80")
	}
	out := []feature{
		{"verdict maps keyed by concatenations (the Service dispatch)", ruleDispatch(f, true, mapServiceIPs)},
		{"fib (node ports on local addresses)", ruleNodePortDispatch(f, false, mapNodePorts)},
		{"numgen (load balancing)", ruleDNAT(f, datapath.TCP, to, 3, 2)},
		{"anonymous interval maps of concatenations (weighted load balancing)", ruleDNATMap(f, datapath.TCP, []datapath.Endpoint{{Addr: to}, {Addr: to}, {Addr: to}}, []uint32{1, 2, 1})},
		{"anonymous maps of concatenations (load balancing)", ruleDNATMap(f, datapath.TCP, []datapath.Endpoint{{Addr: to}, {Addr: to}}, []uint32{1, 1})},
		{"dnat", ruleDNAT(f, datapath.TCP, to, 0, 0)},
		{"ct and set lookups (hairpin)", ruleHairpinMark(f, setHairpin, bit)},
		{"interval sets of concatenations (loadBalancerSourceRanges)", ruleFirewall(f, setFirewallIPs, setFirewallAllow)},
		{"masquerade", ruleMasquerade()},
		{"reject", ruleReject(f)},
		{"set lookups and dynamic set updates with timeouts (session affinity)", ruleAffinityCheck(f, datapath.TCP, to, probeAffSet, time.Hour)},
	}
	return out
}

// probeAffSet is the per-endpoint affinity set the probe creates.
const probeAffSet = "aff-probe"

// probeSets are the sets the probe creates in f's table: the fixed ones
// and a per-endpoint affinity set.
func (f *fam) probeSets() []string {
	var sets []string
	for _, s := range f.sets() {
		sets = append(sets, s.name)
	}
	return append(sets, probeAffSet)
}

// probeBase are the base chain types the datapath hooks.
var probeBase = []chainSpec{
	{name: "nat", typ: nftables.ChainTypeNAT, hook: nftables.ChainHookPrerouting, prio: prioDstNAT},
	{name: "filter", typ: nftables.ChainTypeFilter, hook: nftables.ChainHookPrerouting, prio: prioPreDNAT},
}

// probeSpec is what one probe transaction writes into the throwaway
// table: sets (by name), base chains, and rules in a regular chain.
type probeSpec struct {
	sets  []string
	base  []chainSpec
	feats []feature
}

// Probe checks, before the first apply, that the kernel has what the
// datapath writes: one transaction creates a throwaway table with the
// maps and sets, the nat and filter base chains and a rule of each kind
// of expression, and deletes it again (the table is never committed).
// When the kernel refuses it, each part is tried alone, and the error
// (wrapping ErrKernelSupport) names every part the kernel refuses.
func (p *Proxier) Probe(ctx context.Context) error {
	return p.probe(ctx, func(f *fam) []feature { return f.features(uint32(1) << p.opts.MasqueradeBit) })
}

func (p *Proxier) probe(ctx context.Context, features func(*fam) []feature) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, t := range p.tables {
		if err := ctx.Err(); err != nil {
			return err
		}
		sets := t.f.probeSets()
		feats := features(t.f)
		if p.probeOnce(t.f, probeSpec{sets, probeBase, feats}) == nil {
			continue
		}
		var missing []string
		for _, s := range sets {
			if err := p.probeOnce(t.f, probeSpec{sets: []string{s}}); err != nil {
				missing = append(missing, fmt.Sprintf("set %s: %v", s, err))
			}
		}
		for _, c := range probeBase {
			if err := p.probeOnce(t.f, probeSpec{base: []chainSpec{c}}); err != nil {
				missing = append(missing, fmt.Sprintf("%s base chains: %v", c.name, err))
			}
		}
		if len(missing) == 0 {
			for _, ft := range feats {
				if err := p.probeOnce(t.f, probeSpec{sets: sets, feats: []feature{ft}}); err != nil {
					missing = append(missing, fmt.Sprintf("%s (`%s`): %v", ft.name, ft.rule.text, err))
				}
			}
		}
		if len(missing) == 0 {
			// Refused whole, accepted in parts: say what the whole got.
			missing = append(missing, fmt.Sprint(p.probeOnce(t.f, probeSpec{sets, probeBase, feats})))
		}
		return fmt.Errorf("%w: %s table: %s", ErrKernelSupport, t.f.name, strings.Join(missing, "; "))
	}
	return nil
}

// probeOnce sends one transaction: add (and delete, for a leftover) the
// throwaway table, write spec into it, delete it.
func (p *Proxier) probeOnce(f *fam, spec probeSpec) error {
	// One table with every set, the main table's and a service
	// table's.
	ob := newObjects(f, 1)
	tb := ob.tabs[0]
	tb.Name = probeTable // the sets point at it
	for n, set := range ob.sets[1] {
		set.Table = tb
		ob.sets[0][n] = set
	}
	c := p.conn
	c.AddTable(tb)
	c.DelTable(tb)
	c.AddTable(tb)
	for _, s := range spec.sets {
		set := ob.sets[0][s]
		if set == nil {
			set = ob.affSet(f, 0, s)
		}
		if err := c.AddSet(set, nil); err != nil {
			c.DelTable(tb)
			_ = c.Flush()
			return err
		}
	}
	for _, b := range spec.base {
		c.AddChain(ob.chain(b))
	}
	if len(spec.feats) > 0 {
		ch := c.AddChain(&nftables.Chain{Name: "probe", Table: tb})
		for _, ft := range spec.feats {
			addRule(c, ch, ft.rule)
		}
	}
	c.DelTable(tb)
	return c.Flush()
}
