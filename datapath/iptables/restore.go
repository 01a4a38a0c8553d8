// The iptables-restore transaction of a Ruleset.

package iptables

import (
	"cmp"
	"errors"
	"slices"
	"strings"

	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// restoreText renders the iptables-restore --noflush input for ws. owner[i]
// is the unit that line i+1 belongs to (nil for fixed rules), so a failing
// line can be traced to its service. digests are the fixed chains' as
// written (ws.fixed when they were kept). err lists the objects refused
// when they were added to the transaction, each naming its unit.
func (rs *Ruleset) restoreText(ws writeSpec) (text []byte, owner []*unitID, digests map[xtables.Chain]digest, err error) {
	w := &restoreWriter{rs: rs, ws: ws, digests: ws.fixed, tx: newTransaction()}
	if !ws.keepFixed || ws.write == nil {
		w.fixed = rs.fixedRules()
		w.digests = fixedDigests(w.fixed)
	}
	w.stale = slices.Clone(ws.stale)
	slices.SortFunc(w.stale, func(a, b xtables.Chain) int { return cmp.Compare(a.Name, b.Name) })
	for _, table := range tables {
		w.writeTable(table)
	}
	text, owner, err = w.tx.Render()
	return text, owner, w.digests, err
}

// fixedRule is a rule of a fixed chain and the unit it belongs to (nil
// for the static rules).
type fixedRule struct {
	own  *unitID
	rule *xtables.Rule
}

// fixedRules returns the fixed chains' rules in their fixed order: head
// rules, the units' dispatch rules, tail rules; the hairpin rules. Every
// fixed chain is present, empty ones too, so that each gets a digest.
func (rs *Ruleset) fixedRules() map[xtables.Chain][]fixedRule {
	head, tail := staticRules(&rs.cfg)
	fixed := map[xtables.Chain][]fixedRule{}
	add := func(own *unitID, rs []topRule) {
		for i := range rs {
			tc := xtables.Chain{Table: rs[i].table, Name: rs[i].chain}
			fixed[tc] = append(fixed[tc], fixedRule{own, &rs[i].rule})
		}
	}
	add(nil, head)
	for _, u := range rs.units {
		add(&u.id, u.top)
	}
	add(nil, tail)
	hp := xtables.Chain{Table: xtables.NAT, Name: chainHairpin}
	for _, a := range rs.hairpin() {
		fixed[hp] = append(fixed[hp], fixedRule{nil, &xtables.Rule{Matches: []xtables.Match{xtables.SrcHost(a), xtables.DstHost(a)}, Target: xtables.Masquerade(rs.cfg.RandomFully)}})
	}
	for table, names := range fixedChains {
		for _, name := range names {
			fixed[xtables.Chain{Table: table, Name: name}] = fixed[xtables.Chain{Table: table, Name: name}]
		}
	}
	return fixed
}

func fixedDigests(fixed map[xtables.Chain][]fixedRule) map[xtables.Chain]digest {
	digests := make(map[xtables.Chain]digest, len(fixed))
	var d digester
	for tc, rules := range fixed {
		for _, r := range rules {
			d.rule(r.rule)
		}
		digests[tc] = d.sum()
	}
	return digests
}

// restoreWriter builds the transaction of one restore.
type restoreWriter struct {
	rs      *Ruleset
	ws      writeSpec
	fixed   map[xtables.Chain][]fixedRule // nil when kept
	digests map[xtables.Chain]digest
	stale   []xtables.Chain
	tx      *xtables.Transaction[*unitID]
}

// writeFixed says whether a fixed chain is written: a partial write
// leaves out those whose content is unchanged.
func (w *restoreWriter) writeFixed(tc xtables.Chain) bool {
	if w.ws.write == nil || w.ws.fixed == nil {
		return true
	}
	if w.fixed == nil {
		return false
	}
	d, ok := w.ws.fixed[tc]
	return !ok || d != w.digests[tc]
}

// writeUnit says whether a unit's chains are written.
func (w *restoreWriter) writeUnit(u *unit) bool { return w.ws.write == nil || w.ws.write[u.id] }

// writeTable writes one table's part: chain declarations (fixed, units',
// stale), rules, deletions of stale chains, missing jumps.
func (w *restoreWriter) writeTable(table string) {
	w.tx.Grow(table, w.size(table))
	w.declareChains(table)
	for _, c := range fixedChains[table] {
		tc := xtables.Chain{Table: table, Name: c}
		if !w.writeFixed(tc) {
			continue
		}
		for _, r := range w.fixed[tc] {
			w.tx.Add(r.own, tc, r.rule)
		}
	}
	for _, u := range w.rs.units {
		if !w.writeUnit(u) {
			continue
		}
		for _, c := range u.chains {
			if c.table != table {
				continue
			}
			for i := range c.rules {
				w.tx.Add(&u.id, xtables.Chain{Table: table, Name: c.name}, &c.rules[i])
			}
		}
	}
	for _, s := range w.stale {
		if s.Table == table {
			w.tx.Delete(s)
		}
	}
	// Inserted at the top in reverse, so that they end up in order.
	for i := len(w.ws.jumps) - 1; i >= 0; i-- {
		if j := &w.ws.jumps[i]; j.Table == table {
			w.tx.Insert(xtables.Chain{Table: j.Table, Name: j.Chain}, &j.Rule)
		}
	}
}

// size is about how many operations writeTable adds for table (not
// less), so that the transaction grows once.
func (w *restoreWriter) size(table string) int {
	n := 2*len(w.stale) + len(w.ws.jumps)
	for _, c := range fixedChains[table] {
		if tc := (xtables.Chain{Table: table, Name: c}); w.writeFixed(tc) {
			n += 1 + len(w.fixed[tc])
		}
	}
	for _, u := range w.rs.units {
		if w.writeUnit(u) {
			n += len(u.names) + int(u.rules[tableIndex(table)])
		}
	}
	return n
}

// declareChains declares (and so empties) every chain of table written,
// in name order: the meaning is the same in any order, but iptables-nft
// 1.8 appends declarations in name order to its sorted chain cache and
// walks the cache for each other one (RATIONALE.md, "Why chains are
// declared in name order").
func (w *restoreWriter) declareChains(table string) {
	type declaration struct {
		owner *unitID
		name  string
	}
	var ds []declaration
	for _, c := range fixedChains[table] {
		if w.writeFixed(xtables.Chain{Table: table, Name: c}) {
			ds = append(ds, declaration{nil, c})
		}
	}
	for _, u := range w.rs.units {
		if !w.writeUnit(u) {
			continue
		}
		if u.summary {
			if table == tables[0] {
				w.tx.Fail(&u.id, errors.New("unit to write was not rendered"))
			}
			continue
		}
		for _, c := range u.chains {
			if c.table == table {
				ds = append(ds, declaration{&u.id, c.name})
			}
		}
	}
	for _, s := range w.stale {
		if s.Table == table {
			ds = append(ds, declaration{nil, s.Name})
		}
	}
	slices.SortStableFunc(ds, func(a, b declaration) int { return strings.Compare(a.name, b.name) })
	for _, d := range ds {
		w.tx.Declare(d.owner, xtables.Chain{Table: table, Name: d.name})
	}
}
