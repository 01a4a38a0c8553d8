// A sync of the iptables datapath: Apply chooses each family's mode
// (decideMode, mode.go), applies it, records it in the metrics and in the
// fingerprint the tamper monitor trusts, then cleans up conntrack. What a family writes is in
// write.go, how its jumps from the built-in chains are found and put in
// place in jumps.go.

package iptables

import (
	"context"
	"errors"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// Apply implements datapath.Backend. Normally only the chains whose
// rendered rules differ from what was last written are written, and chains
// no longer wanted are deleted, in one atomic iptables-restore. Everything
// is rewritten on the first apply since New, after a failed apply, after
// tampering was seen, and once per FullSyncPeriod; plan.Full otherwise
// asks for a compare (see syncMode). A service port whose rules the
// kernel refuses is left out and named in the error; the others are
// programmed. After a successful apply, stale UDP conntrack entries are
// deleted.
func (p *Proxier) Apply(ctx context.Context, plan *datapath.Plan) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	ok := true
	// One family after the other, from the calling goroutine: the tools
	// run in its thread's network namespace (a goroutine of its own may
	// run on a thread in another), and iptables-legacy's families share
	// one lock, which a restore that finds taken retries a second later.
	for _, f := range p.fams {
		fatal, err := p.applyFamily(ctx, f, plan)
		if err != nil {
			errs = append(errs, err)
		}
		ok = ok && !fatal
	}
	// A failed conntrack cleanup does not fail the apply: the rules are
	// right, the cleaner counts the failure, and the next sync tries again.
	if ok && p.ct != nil {
		if _, err := p.ct.Reconcile(ctx, plan.Frontends, plan.Full); err != nil {
			p.log.Warn("conntrack cleanup after the apply failed; retried next sync", "err", err)
		}
	}
	return errors.Join(errs...)
}

// applyFamily applies plan to one family's tables and records it in the
// metrics; fatal is a failure that left the family's rules unwritten.
func (p *Proxier) applyFamily(ctx context.Context, f *family, plan *datapath.Plan) (fatal bool, err error) {
	// plan.Full asks for a compare: the sentinel rules are checked unless
	// the tables' fingerprint shows no write since they last passed (a
	// flush found there turns it into a rewrite), and every unit whose
	// input moved is rendered again without trusting plan.Changed.
	mode := decideMode(modeInput{
		applied:    f.applied,
		owed:       f.needFull,
		rewriteDue: time.Since(f.lastRewrite) >= p.opts.FullSyncPeriod,
		compare:    plan.Full,
	}, func() bool {
		if f.unchanged(p.watched()) {
			return false
		}
		t, err := f.tampered(ctx)
		return err != nil || t
	})
	if ips, err := datapath.NodePortIPs(f.cfg.Family, f.npa, f.primary, plan.NodeIPs, localAddrs); err != nil {
		f.log.Warn("cannot list the node's addresses; node ports keep the addresses they had", "err", err)
	} else {
		f.cfg.NodePortIPs = ips
	}
	f.cfg.HealthCheckPorts = plan.HealthCheckPorts
	if p.opts.NodePodCIDRs && p.opts.PodInterface == "" {
		f.followPodCIDRs(plan.PodCIDRs)
	}
	start := time.Now()
	pre, read, trusted := f.verifiedNow()
	st, err := f.apply(ctx, plan, mode)
	switch {
	case err == nil && mode == modeRewrite && read && f.trustRewrite(pre):
	case err == nil && trusted:
		f.trustOwnWrite(pre)
	}
	if mode == modeRewrite {
		p.m.fullDuration.Observe(time.Since(start).Seconds())
	} else {
		p.m.partialDuration.Observe(time.Since(start).Seconds())
	}
	p.m.restoreFailures.Add(float64(st.failures))
	if mode != modeRewrite {
		p.m.partialFailures.Add(float64(st.failures))
	}
	if st.bytes > 0 {
		p.m.restoreBytes.Set(float64(st.bytes))
	}
	for t, n := range st.rules {
		p.m.rules.WithLabelValues(t).Set(float64(n))
	}
	// Where the time went: a restore's wall time against its own CPU time
	// tells a busy machine (the restore waited for a core) from a larger
	// write.
	f.log.Debug("applied plan", "generation", plan.Generation, "mode", mode, "written", st.written, "units", st.units, "bytes", st.bytes,
		"took", time.Since(start), "render", st.render, "restore", st.restore.Wall, "restoreCPU", st.restore.CPU)
	return err != nil && st.fatal, err
}

// Unchanged reports whether every family's tables are as the last apply
// left them, as far as a cheap look tells: a plan was applied and did not
// fail, the tables' fingerprint is the one the tamper monitor last
// verified (moved since only by our own applies), no periodic rewrite is
// due, and no node port follows the node's addresses (those are read at
// every apply). The agent then skips the periodic compare of a quiet node.
func (p *Proxier) Unchanged() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range p.fams {
		if !f.applied || f.needFull || len(f.npa) > 0 || f.primary || time.Since(f.lastRewrite) >= p.opts.FullSyncPeriod {
			return false
		}
		if _, _, ok := f.verifiedNow(); !ok {
			return false
		}
	}
	return true
}

type applyStats struct {
	units, written, bytes int
	failures              int
	fatal                 bool
	rules                 map[string]int
	render                time.Duration        // rendering the rules and the restore input
	restore               xtables.RestoreStats // of the last restore
}

// apply writes plan in mode and remembers what it wrote.
func (f *family) apply(ctx context.Context, plan *datapath.Plan, mode syncMode) (applyStats, error) {
	var st applyStats
	existing, missing, listed, err := f.existingChains(mode)
	if err != nil {
		f.needFull = true
		st.fatal = true
		return st, err
	}
	w, err := f.write(ctx, &st, plan, mode, existing, missing)
	errs := w.errs
	if err == nil && mode == modeRewrite && !listed {
		// A periodic rewrite: the jumps are checked one by one.
		err = f.ensureJumps()
	}
	if err == nil && (listed || mode == modeRewrite) {
		err = f.orderJumps()
	}
	if err != nil {
		f.needFull = true
		st.fatal = true
		return st, errors.Join(append(errs, err)...)
	}
	st.units = len(w.rs.units)
	if w.spec.write == nil {
		st.written = len(w.rs.units)
	} else {
		st.written = len(w.spec.write)
	}
	f.remember(w.rs, w.fixed, mode)
	st.rules = w.rs.ruleCounts()
	return st, errors.Join(errs...)
}
