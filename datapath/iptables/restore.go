// The iptables-restore text of a Ruleset: one transaction per table.

package iptables

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"slices"
)

// restoreText renders the iptables-restore --noflush input for ws. owner[i]
// is the unit that line i+1 belongs to ("" for fixed rules), so a failing
// line can be traced to its service.
func (rs *Ruleset) restoreText(ws writeSpec) (text []byte, owner []string, digests map[tableChain][32]byte) {
	fixed := rs.fixedRules()
	digests = fixedDigests(fixed)
	w := &restoreWriter{rs: rs, ws: ws, fixed: fixed, digests: digests}
	w.stale = slices.Clone(ws.stale)
	slices.SortFunc(w.stale, func(a, b tableChain) int { return cmp.Compare(a.name, b.name) })
	w.grow()
	for _, table := range []string{tableFilter, tableNAT} {
		w.writeTable(table)
	}
	return w.b.Bytes(), w.owner, digests
}

// fixedRule is a rule of a fixed chain and the unit it belongs to ("" for
// the static rules).
type fixedRule struct{ own, spec string }

// fixedRules returns the fixed chains' rules in their fixed order: head
// rules, the units' dispatch rules, tail rules; the hairpin rules. Every
// fixed chain is present, empty ones too, so that each gets a digest.
func (rs *Ruleset) fixedRules() map[tableChain][]fixedRule {
	head, tail := staticRules(&rs.cfg)
	fixed := map[tableChain][]fixedRule{}
	for _, r := range head {
		tc := tableChain{r.table, r.chain}
		fixed[tc] = append(fixed[tc], fixedRule{"", r.spec})
	}
	for _, u := range rs.units {
		for _, r := range u.top {
			tc := tableChain{r.table, r.chain}
			fixed[tc] = append(fixed[tc], fixedRule{u.id, r.spec})
		}
	}
	for _, r := range tail {
		tc := tableChain{r.table, r.chain}
		fixed[tc] = append(fixed[tc], fixedRule{"", r.spec})
	}
	masq := "-j MASQUERADE"
	if rs.cfg.RandomFully {
		masq += " --random-fully"
	}
	hp := tableChain{tableNAT, chainHairpin}
	for _, a := range rs.hairpin() {
		m := rs.cfg.hostMask()
		fixed[hp] = append(fixed[hp], fixedRule{"", "-s " + a.String() + m + " -d " + a.String() + m + " " + masq})
	}
	for table, names := range fixedChains {
		for _, name := range names {
			fixed[tableChain{table, name}] = fixed[tableChain{table, name}]
		}
	}
	return fixed
}

func fixedDigests(fixed map[tableChain][]fixedRule) map[tableChain][32]byte {
	digests := make(map[tableChain][32]byte, len(fixed))
	for tc, rules := range fixed {
		h := sha256.New()
		for _, r := range rules {
			h.Write([]byte(r.spec))
			h.Write([]byte{'\n'})
		}
		var d [32]byte
		copy(d[:], h.Sum(nil))
		digests[tc] = d
	}
	return digests
}

// restoreWriter writes one iptables-restore text and, per line, the unit
// that owns it (for naming the service whose rule the kernel refused).
type restoreWriter struct {
	rs      *Ruleset
	ws      writeSpec
	fixed   map[tableChain][]fixedRule
	digests map[tableChain][32]byte
	stale   []tableChain
	b       bytes.Buffer
	owner   []string
}

// writeFixed says whether a fixed chain is written: a partial write
// leaves out those whose content is unchanged.
func (w *restoreWriter) writeFixed(tc tableChain) bool {
	if w.ws.write == nil || w.ws.fixed == nil {
		return true
	}
	d, ok := w.ws.fixed[tc]
	return !ok || d != w.digests[tc]
}

// writeUnit says whether a unit's chains are written.
func (w *restoreWriter) writeUnit(u *unit) bool { return w.ws.write == nil || w.ws.write[u.id] }

// grow sizes the output for what is written only: a partial sync of one
// service must not allocate for the whole rule set.
func (w *restoreWriter) grow() {
	size, lines := 4096, 64
	for tc, rules := range w.fixed {
		if w.writeFixed(tc) {
			for _, r := range rules {
				lines++
				size += len(tc.name) + len(r.spec) + 5
			}
		}
	}
	for _, u := range w.rs.units {
		if !w.writeUnit(u) {
			continue
		}
		for _, c := range u.chains {
			lines += 1 + len(c.rules)
			size += 40 + len(c.rules)*(len(c.name)+4)
			for _, r := range c.rules {
				size += len(r)
			}
		}
	}
	w.b.Grow(size)
	w.owner = make([]string, 0, lines)
}

func (w *restoreWriter) line(own string, parts ...string) {
	for _, p := range parts {
		w.b.WriteString(p)
	}
	w.b.WriteByte('\n')
	w.owner = append(w.owner, own)
}

// writeTable writes one table's transaction: chain declarations (fixed,
// units', stale), rules, deletions of stale chains, missing jumps.
func (w *restoreWriter) writeTable(table string) {
	w.line("", "*", table)
	w.declareChains(table)
	for _, c := range fixedChains[table] {
		tc := tableChain{table, c}
		if !w.writeFixed(tc) {
			continue
		}
		for _, r := range w.fixed[tc] {
			w.line(r.own, "-A ", c, " ", r.spec)
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
			for _, r := range c.rules {
				w.line(u.id, "-A ", c.name, " ", r)
			}
		}
	}
	for _, s := range w.stale {
		if s.table == table {
			w.line("", "-X ", s.name)
		}
	}
	// Inserted at the top in reverse, so that they end up in order.
	for i := len(w.ws.jumps) - 1; i >= 0; i-- {
		if j := w.ws.jumps[i]; j.table == table {
			w.line("", "-I ", j.chain, " 1 ", joinSpec(j.spec))
		}
	}
	w.line("", "COMMIT")
}

// declareChains declares (and so empties) every chain of table written.
func (w *restoreWriter) declareChains(table string) {
	for _, c := range fixedChains[table] {
		if w.writeFixed(tableChain{table, c}) {
			w.line("", ":", c, " - [0:0]")
		}
	}
	for _, u := range w.rs.units {
		if !w.writeUnit(u) {
			continue
		}
		for _, c := range u.chains {
			if c.table == table {
				w.line(u.id, ":", c.name, " - [0:0]")
			}
		}
	}
	for _, s := range w.stale {
		if s.table == table {
			w.line("", ":", s.name, " - [0:0]")
		}
	}
}
