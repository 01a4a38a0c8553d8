package iptables

import (
	"context"
	"errors"
	"fmt"
	"time"

	goipt "github.com/coreos/go-iptables/iptables"

	"github.com/edgeproxy/edgeproxy/datapath/nfgen"
	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// sentinels are rules whose absence means someone changed our rules: the
// canaries (gone after a flush of a table), the last rule of nat
// EP-SERVICES (gone after a flush of that chain) and the jumps.
func (f *family) sentinels() []xtables.Jump {
	out := jumps(f.cfg.Family)
	out = append(out, xtables.Jump{Table: xtables.NAT, Chain: chainCanary, Rule: canaryRule}, xtables.Jump{Table: xtables.Filter, Chain: chainCanary, Rule: canaryRule})
	_, tail := staticRules(&f.cfg)
	for _, r := range tail {
		out = append(out, xtables.Jump{Table: r.table, Chain: r.chain, Rule: r.rule})
	}
	return out
}

// Tampered implements datapath.Monitor: it reports whether any rule that
// must be present after an apply is missing, and if so makes the next
// Apply rewrite everything. Before the first apply it reports false.
//
// While the tables' fingerprint (see fingerprint.go) is what it was at the
// last full check that passed, nothing was written and the answer is no,
// for up to recheckEvery (on iptables-nft, for as long as WatchWrites runs).
//
// On large rule sets a check is not free (iptables-legacy copies whole
// tables), so once a check takes over 100ms, checks are spaced to at least
// ten times the duration of the last one: the cost stays under a tenth of
// a core however often the agent asks, and a flush is still seen within
// seconds.
func (p *Proxier) Tampered(ctx context.Context) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var written []*family
	watched := p.watched()
	for _, f := range p.fams {
		if f.applied && !f.unchanged(watched) {
			written = append(written, f)
		}
	}
	if len(written) == 0 {
		return false, nil
	}
	if p.checkCost > 100*time.Millisecond && time.Since(p.lastCheck) < 10*p.checkCost {
		return false, nil
	}
	start := time.Now()
	defer func() {
		p.lastCheck, p.checkCost = time.Now(), time.Since(start)
	}()
	for _, f := range written {
		if t, err := f.tampered(ctx); t || err != nil {
			return t, err
		}
	}
	return false, nil
}

// recheckEvery bounds how long the fingerprint alone vouches for the
// rules: a full check runs at least this often, unless a watch of the
// writes runs (see WatchWrites).
const recheckEvery = 5 * time.Minute

// WatchWrites implements datapath.Watcher. On iptables-nft it signals on
// written after every nf_tables commit (anyone's, in any table or family,
// our own applies too; see nfgen.Watch) until ctx is done, then returns
// nil. It watches the calling thread's network namespace: call it from a
// goroutine in the namespace the Proxier programs (the process's; in the
// tests, one locked in the test's namespace). On iptables-legacy it
// returns ErrNoWatch at once.
//
// While a watch runs, Tampered no longer forces a full check every
// recheckEvery on iptables-nft: the generation it compares moves with
// every commit, and each commit is announced, so the checks that follow
// the signals see every write. Once the watch ends or fails, the periodic
// full check comes back.
func (p *Proxier) WatchWrites(ctx context.Context, written chan<- struct{}) error {
	if v := p.Variant(); v != NFT {
		return fmt.Errorf("iptables: %s: %w", v, ErrNoWatch)
	}
	p.watches.Add(1)
	defer p.watches.Add(-1)
	if err := nfgen.Watch(ctx, written); err != nil {
		return fmt.Errorf("iptables: watch writes: %w", err)
	}
	return nil
}

// watched reports whether a WatchWrites runs.
func (p *Proxier) watched() bool { return p.watches.Load() > 0 }

// unchanged reports whether the tables' fingerprint is the one of the last
// full check that passed, and that check is recent enough: under
// recheckEvery, or any age on iptables-nft while its writes are watched.
// It keeps the fingerprint it read for the full check that follows when
// it is not.
func (f *family) unchanged(watched bool) bool {
	fp, ok := f.fingerprint()
	fresh := time.Since(f.verifiedAt) < recheckEvery || (watched && f.x.Variant == NFT)
	if ok && f.verified && fp == f.verifiedFP && fresh {
		return true
	}
	f.verified = false
	f.readFP, f.readOK = fp, ok
	return false
}

// verifiedNow reads the fingerprint before an apply (read: it could) and
// reports whether the tables are still as the last passing check saw them.
func (f *family) verifiedNow() (fp uint64, read, verified bool) {
	fp, read = f.fingerprint()
	return fp, read, read && f.verified && fp == f.verifiedFP
}

// trustOwnWrite keeps the tables verified across a successful apply that
// started from verified tables, so that our own writes do not send the
// monitor into a full check (which holds the lock the next apply needs).
// With nf_tables the generation must have moved by at most our
// transactions (one per table in the restore); anything more was someone
// else, and is checked in full.
// x_tables cannot tell our write from another made in the same instant.
func (f *family) trustOwnWrite(pre uint64) {
	post, ok := f.fingerprint()
	if !ok || (f.x.Variant == NFT && (post < pre || post > pre+2)) {
		f.verified = false
		return
	}
	f.verifiedFP = post // verifiedAt stays: the periodic full check still comes
}

// trustRewrite verifies the tables after a successful rewrite of all our
// rules, whether they were verified before or not, and reports whether it
// did: the rewrite put every sentinel in place (the chains, the canaries,
// the jumps it found missing; a rewrite that found them present checked
// them one by one), so if nothing else was committed between the
// fingerprint read before it (pre) and the one after, the tables are what
// a full check would find. Only nf_tables can tell: its generation moved
// by at most our transactions. On x_tables, and when someone else wrote
// meanwhile, it reports false: the tables stay as verified as they were,
// and the monitor's next look checks them in full if need be.
func (f *family) trustRewrite(pre uint64) bool {
	if f.x.Variant != NFT {
		return false
	}
	post, ok := f.fingerprint()
	if !ok || post < pre || post > pre+2 {
		return false
	}
	f.verified, f.verifiedFP, f.verifiedAt = true, post, time.Now()
	return true
}

// tampered runs the full check with iptables. The fingerprint read before
// it (by unchanged) is kept when it passes: a write during the check
// changes the fingerprint, so the next call checks again.
func (f *family) tampered(ctx context.Context) (bool, error) {
	f.fullChecks++
	var bad bool
	var err error
	if f.x.Variant == Legacy {
		bad, err = f.tamperedSave(ctx)
	} else {
		bad, err = f.tamperedCheck(ctx)
	}
	if err == nil && !bad && f.readOK {
		f.verified, f.verifiedFP, f.verifiedAt = true, f.readFP, time.Now()
	}
	return bad, err
}

func (f *family) tamperedCheck(ctx context.Context) (bool, error) {
	// iptables-nft reads only the chain a check names: one check per rule.
	for _, s := range f.sentinels() {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		ok, err := f.ipt.Exists(s.Table, s.Chain, s.Rule.Args()...)
		if err != nil {
			var e *goipt.Error
			if !errors.As(err, &e) || !(e.IsNotExist() || e.ExitStatus() == 1) {
				return false, fmt.Errorf("iptables: check %s/%s: %w", s.Table, s.Chain, err)
			}
			ok = false // the chain itself is gone
		}
		if !ok {
			f.log.Warn("our rules were changed behind our back; the next sync rewrites them", "table", s.Table, "chain", s.Chain, "rule", s.Rule.Text())
			f.needFull = true
			return true, nil
		}
	}
	return false, nil
}

// tamperedSave is tampered for iptables-legacy, where every command copies
// the whole table out of the kernel: one iptables-save per table, searched
// for each sentinel (a rule in its chain jumping to its target, with its
// comment).
func (f *family) tamperedSave(ctx context.Context) (bool, error) {
	dumps := map[string]string{}
	for _, t := range []string{xtables.NAT, xtables.Filter} {
		out, err := f.x.SaveTable(ctx, t)
		if err != nil {
			return false, fmt.Errorf("iptables: %w", err)
		}
		dumps[t] = out
	}
	for _, s := range f.sentinels() {
		found := hasRule(dumps[s.Table], s)
		if !found {
			f.log.Warn("our rules were changed behind our back; the next sync rewrites them", "table", s.Table, "chain", s.Chain, "rule", s.Rule.Text())
			f.needFull = true
			return true, nil
		}
	}
	return false, nil
}
