package nftables

import (
	"context"
	"fmt"
	"slices"

	"github.com/edgeproxy/edgeproxy/datapath"
)

var _ datapath.Monitor = (*Proxier)(nil)

// Tampered reports whether someone else changed the shape of our tables
// since they were last verified: a table gone, a chain of ours missing or
// a chain added. It asks nf_tables' ruleset generation first (one small
// request) and lists chain names only when a commit happened since the
// last check; it never reads rules or elements. A table found tampered
// with is rebuilt by the next Apply (with plan.Full, as the agent then
// sends). Not seen: rules edited inside a chain that keeps its name, and
// elements changed by hand.
func (p *Proxier) Tampered(ctx context.Context) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	gen, err := p.conn.GetGen()
	if err != nil {
		return false, fmt.Errorf("nftables: ruleset generation: %w", err)
	}
	if p.verified && gen.ID == p.verifiedGen {
		return false, nil
	}
	tampered := false
	for _, t := range p.tables {
		if !t.written || t.needFull {
			continue // rebuilt by the next Apply anyway
		}
		chains, err := p.conn.ListChainsOfTableFamily(t.f.tf)
		if err != nil {
			return false, fmt.Errorf("nftables: list %s chains: %w", t.f.name, err)
		}
		var have []string
		for _, c := range chains {
			if c.Table != nil && c.Table.Name == TableName {
				have = append(have, c.Name)
			}
		}
		slices.Sort(have)
		if !slices.Equal(have, t.chainNames(&p.opts)) {
			t.needFull, tampered = true, true
			p.log.Warn("edgeproxy's nftables table was changed by someone else; rewriting it at the next sync", "family", t.f.name)
		}
	}
	p.verified, p.verifiedGen = !tampered, gen.ID
	return tampered, nil
}

// chainNames are the chains the table holds as last written, sorted.
func (t *table) chainNames(o *Options) []string {
	var out []string
	for _, c := range t.f.fixedChains(o, t.npIPs != nil) {
		out = append(out, c.name)
	}
	for _, u := range t.units {
		for _, c := range u.chains {
			out = append(out, c.name)
		}
	}
	slices.Sort(out)
	return out
}

// genVerified returns the ruleset generation, and whether the tables were
// verified at it: then an apply's own transactions can keep them verified
// (trustOwn).
func (p *Proxier) genVerified() (uint32, bool) {
	if !p.verified {
		return 0, false
	}
	gen, err := p.conn.GetGen()
	if err != nil || gen.ID != p.verifiedGen {
		return 0, false
	}
	return gen.ID, true
}

// trustOwn keeps the tables verified across an apply that started from
// verified tables at generation gen0 and committed txs transactions, when
// the generation moved by exactly that: then no one else committed in
// between, and Tampered, asked after the commits the watch announced,
// need not list the chains again (at 10k Services, a dump of 10k names
// after each of our own applies). Anything else is left to Tampered.
func (p *Proxier) trustOwn(gen0 uint32, txs int) {
	gen, err := p.conn.GetGen()
	if err == nil && gen.ID == gen0+uint32(txs) {
		p.verifiedGen = gen.ID
	}
}
