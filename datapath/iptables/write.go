// Writing a family's rules: the ruleset rendered (reusing the units that
// did not change), what one iptables-restore --noflush writes of it, the
// restore itself with its retries around refused units, and what is
// remembered for the next sync.

package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// emptyRestore is the restore input of a partial sync that changes nothing.
var emptyRestore = []byte("*filter\nCOMMIT\n*nat\nCOMMIT\n")

// written is what one restore wrote: the ruleset rendered, which of its
// chains were written (spec), the fixed chains' digests as written, and
// the units left out because the tables refused them (PortErrors).
type written struct {
	rs    *Ruleset
	spec  writeSpec
	fixed map[xtables.Chain]digest
	errs  []error
}

// write renders the plan and writes it in one restore. When the restore
// fails on a unit's line, that unit is left out (its error in errs) and
// the rest written again; err is a failure no unit is to blame for, or
// the last one after maxRounds.
func (f *family) write(ctx context.Context, st *applyStats, plan *datapath.Plan, mode syncMode, existing []xtables.Chain, missing []xtables.Jump) (w written, err error) {
	// Each round either succeeds or drops the unit that a failed line
	// belongs to; the bound keeps a systematic failure from looping.
	const maxRounds = 8
	dropped := map[unitID]bool{}
	// A rewrite always writes: its iptables-restore starts before the
	// render, so that the process's start-up overlaps with it. Its input
	// is written only once it is rendered whole and its objects have
	// passed their checks; a render refused before that aborts it, and
	// the kernel keeps the rules it has.
	var rr restorer
	if mode == modeRewrite {
		rr, _ = f.io.StartRestore(ctx) // on failure, started again below and reported there
	}
	defer func() {
		if rr != nil {
			rr.Abort()
		}
	}()
	for round := 0; ; round++ {
		var keepFixed bool
		began := time.Now()
		w.rs, keepFixed = f.ruleset(plan, mode, dropped)
		if round == 0 {
			w.errs = w.rs.Errors
		}
		w.spec = f.writeSpec(w.rs, w.rs.chains(), existing, missing, mode)
		w.spec.keepFixed = keepFixed
		var text []byte
		var owner []*unitID
		text, owner, w.fixed, err = w.rs.restoreText(w.spec)
		st.bytes, st.render = len(text), time.Since(began)
		if err == nil {
			if mode != modeRewrite && len(w.spec.write) == 0 && len(w.spec.stale) == 0 && bytes.Equal(text, emptyRestore) {
				return w, nil // nothing changed
			}
			st.restore, err = f.restore(ctx, &rr, text)
		}
		if err == nil {
			return w, nil
		}
		st.failures++
		id := xtables.FailedOwner(err, owner)
		if id == nil || round == maxRounds-1 {
			return w, err
		}
		var oe *xtables.OpError[*unitID]
		if !errors.As(err, &oe) { // an OpError names its unit already
			err = fmt.Errorf("iptables: unit %s: %w", id, err)
		}
		w.errs = append(w.errs, &datapath.PortError{Service: id.service, Err: err})
		dropped[*id] = true
	}
}

// ruleset renders the plan, reusing the units of the last sync that did
// not change (see reuse) and leaving out the dropped ones. keepFixed says
// the fixed chains are as last written; when they are not, units taken
// from the last sync are rendered again, as the fixed chains hold rules
// of every unit.
func (f *family) ruleset(plan *datapath.Plan, mode syncMode, dropped map[unitID]bool) (rs *Ruleset, keepFixed bool) {
	rs = render(f.cfg, plan.Frontends, f.reuse(plan, mode))
	rs.dropAll(dropped)
	keepFixed = mode != modeRewrite && rs.fixedSum() == f.lastFixedSum
	if !keepFixed && rs.summaries() {
		rs = render(f.cfg, plan.Frontends, nil)
		rs.dropAll(dropped)
	}
	return rs, keepFixed
}

// reuse returns how render takes units from the last apply: those of
// service ports the plan says did not change are not rendered again but
// taken as the summaries kept (see family.ruleset for when they are
// rendered after all). A compare does not trust plan.Changed: it takes a
// summary only when the unit's input hash (its frontends and the
// rendering config) is the one it was rendered from, and renders the
// others. Nil (render everything) on a rewrite.
func (f *family) reuse(plan *datapath.Plan, mode syncMode) reuseFunc {
	switch {
	case mode == modeRewrite || len(f.units) == 0:
		return nil
	case mode == modeCompare || plan.Changed == nil:
		return func(id unitID, in func() inputSum) *unit {
			if last := f.units[id]; last != nil && last.input == in() {
				return last
			}
			return nil
		}
	}
	return func(id unitID, _ func() inputSum) *unit {
		if plan.Changed[id.service] {
			return nil
		}
		return f.units[id]
	}
}

// writeSpec says what one restore writes: on a rewrite everything, and
// the existing chains not desired are deleted; otherwise only units whose
// digest changed, fixed chains whose content changed, and deletions of
// the chains written last that are no longer desired.
func (f *family) writeSpec(rs *Ruleset, desired map[xtables.Chain]bool, existing []xtables.Chain, missing []xtables.Jump, mode syncMode) writeSpec {
	ws := writeSpec{jumps: missing}
	if mode == modeRewrite {
		for _, c := range existing {
			if !desired[c] && !isFixed(c) {
				ws.stale = append(ws.stale, c)
			}
		}
		return ws
	}
	ws.write = map[unitID]bool{}
	for _, u := range rs.units {
		if last, ok := f.units[u.id]; !ok || last.digest != u.digest {
			ws.write[u.id] = true
		}
	}
	for _, u := range f.units {
		for _, c := range u.names {
			if !desired[c] {
				ws.stale = append(ws.stale, c)
			}
		}
	}
	ws.fixed = f.lastFixed
	return ws
}

// remember records what a successful apply wrote, for the next one: unit
// summaries and digests, no rule text.
func (f *family) remember(rs *Ruleset, fixed map[xtables.Chain]digest, mode syncMode) {
	f.units = make(map[unitID]*unit, len(rs.units))
	for _, u := range rs.units {
		if !u.summary {
			u = u.summarize()
		}
		f.units[u.id] = u
	}
	f.lastFixed = fixed
	f.lastFixedSum = rs.fixedSum()
	if mode == modeRewrite {
		f.lastRewrite = time.Now()
	}
	f.applied = true
	f.needFull = false
}

func isFixed(c xtables.Chain) bool {
	for _, n := range fixedChains[c.Table] {
		if n == c.Name {
			return true
		}
	}
	return false
}

// restore writes text with one iptables-restore --noflush: *rr when one
// was started (it is used up), else a new one.
func (f *family) restore(ctx context.Context, rr *restorer, text []byte) (xtables.RestoreStats, error) {
	r := *rr
	*rr = nil
	if r == nil {
		var err error
		if r, err = f.io.StartRestore(ctx); err != nil {
			return xtables.RestoreStats{}, fmt.Errorf("iptables: %w", err)
		}
	}
	_, _ = r.Write(text) // a failed write is reported by Commit
	st, err := r.Commit()
	if err != nil {
		return st, fmt.Errorf("iptables: %w", err)
	}
	return st, nil
}

// ruleCounts returns how many rules the ruleset holds per table.
func (rs *Ruleset) ruleCounts() map[string]int {
	out := map[string]int{xtables.NAT: 0, xtables.Filter: 0}
	head, tail := staticRules(&rs.cfg)
	for _, r := range append(head, tail...) {
		out[r.table]++
	}
	for _, u := range rs.units {
		for i, t := range tables {
			out[t] += int(u.rules[i])
		}
	}
	return out
}
