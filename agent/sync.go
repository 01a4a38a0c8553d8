package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/edgeproxy/edgeproxy/agent/healthcheck"
	"github.com/edgeproxy/edgeproxy/agent/planner"
	"github.com/edgeproxy/edgeproxy/agent/policychain"
	"github.com/edgeproxy/edgeproxy/agent/state"
	"github.com/edgeproxy/edgeproxy/datapath"
)

// sync is the runner's work function: snapshot → plan → apply. A failed
// apply makes the next sync a full one; trigger times of the changes it
// carried stay queued so the latency metric counts them when they land.
func (a *Agent) sync(ctx context.Context) error {
	start, faults := time.Now(), majorFaults()
	a.mu.Lock()
	defer a.mu.Unlock()
	defer a.gc.afterSync(a.gc.mark())
	// The watchdog wants to know the loop turns, not that it succeeds: a
	// node that cannot reach its cloud is stale, not hung.
	defer a.notifier.Progress()

	snap := a.state.Snapshot()
	a.nodeIneligible.Store(snap.Node != nil && snap.Node.Ineligible)
	a.triggers = append(a.triggers, snap.TriggerTimes...)
	if !snap.Oldest.IsZero() {
		a.metrics.lastQueued.Set(float64(snap.Oldest.Unix()))
	}
	kind := decide(a.syncInput(snap, start))
	switch {
	case kind == syncPartialFirst:
		a.deferred = true
	case kind.quietCompare():
		a.lastFull = start
		a.metrics.quietCompares.Inc()
	}
	if !kind.plans() {
		// Nothing moved: the last plan stands, and the rules are as
		// programmed as they were (alerts on a stale timestamp stay quiet).
		a.metrics.lastSync.Set(float64(start.Unix()))
		if p := a.last.Load(); p != nil {
			a.flushSnapshot(p.res, start) // one the interval put off
		}
		if kind == syncRest && a.mayRest() {
			a.runner.Rest(restWhenQuiet)
		}
		return nil
	}
	// One shadow budget for the whole sync (policy.shadowBudget): the
	// planner weighs its ports in several batches.
	res := a.planner.Build(policychain.WithShadowBudget(ctx), snap)
	refused := a.quarantine.sanitize(res.Plan, snap)
	// Changed probe verdicts change frontends outside plan.Changed.
	res.Plan.Full = a.applyProbeVerdicts(res.Plan, snap) || kind.full()
	a.metrics.portsEvaluated.Add(float64(res.Evaluated))

	if kind == syncCompare && len(res.Plan.Changed) > 0 {
		// The compare renders every service again (tens of
		// milliseconds at 10k): the changes it carries are applied
		// first, on their own, so that they do not wait for it.
		changes := *res.Plan
		changes.Full = false
		if _, err := datapath.SplitPortErrors(a.backend.Apply(ctx, &changes)); err != nil {
			return a.applyFailed(res, err)
		}
		a.observeProgrammed(time.Now())
	}
	ports, err := datapath.SplitPortErrors(a.backend.Apply(ctx, res.Plan))
	if err != nil {
		return a.applyFailed(res, err)
	}
	now := time.Now()
	if res.Plan.Full {
		a.lastFull, a.comparedGen, a.deferred = now, snap.Generation, false
	}
	a.syncedGen, a.syncedOffline = snap.Generation, a.fromSnapshot.Load()
	a.needFull = false
	a.lastErr = nil
	for _, pe := range ports {
		refused = append(refused, datapath.Refusal{Service: pe.Service, Reason: pe.Err.Error()})
	}
	a.quarantine.report(refused)
	a.last.Store(&published{res: res, refused: refused})
	a.probes.publish()
	a.observeSync(res, start, now)
	a.afterSync(res, start, now)
	if res.Plan.Full && a.mayRest() {
		// A full plan is a compare: once applied, nothing is left to
		// guard until something moves.
		a.runner.Rest(restWhenQuiet)
	}
	a.log.Debug("synced", "kind", kind, "generation", res.Plan.Generation, "full", res.Plan.Full,
		"changed", len(res.Plan.Changed), "evaluated", res.Evaluated, "took", now.Sub(start), "majorFaults", majorFaults()-faults)
	return nil
}

// applyFailed records a failed apply: the next sync is a full one.
func (a *Agent) applyFailed(res *planner.Result, err error) error {
	a.needFull = true
	a.lastErr = err
	a.metrics.syncErrors.Inc()
	return fmt.Errorf("apply plan generation %d: %w", res.Plan.Generation, err)
}

// observeProgrammed records the latency of every change waiting for the
// kernel, now programmed.
func (a *Agent) observeProgrammed(now time.Time) {
	for _, t := range a.triggers {
		if d := now.Sub(t); d >= 0 {
			a.metrics.programming.Observe(d.Seconds())
		}
	}
	a.triggers = a.triggers[:0]
}

// observeSync records a programmed plan in the metrics: the latency of
// every change it carried (unless a compare's first apply did), the
// sync's duration and the plan's size.
func (a *Agent) observeSync(res *planner.Result, start, now time.Time) {
	a.observeProgrammed(now)
	a.metrics.syncDuration.Observe(now.Sub(start).Seconds())
	a.metrics.lastSync.Set(float64(now.Unix()))
	a.metrics.frontends.Set(float64(len(res.Plan.Frontends)))
	a.metrics.setNoLocalEndpoints(res.Plan.Frontends)
	a.metrics.generation.Set(float64(res.Plan.Generation))
}

// afterSync does what follows a programmed plan: health-check servers,
// the externalIPs warning, the snapshot, another sync while IPVS real
// servers drain, readiness after the first sync, and the systemd status.
func (a *Agent) afterSync(res *planner.Result, start, now time.Time) {
	if a.health != nil {
		if err := a.health.Update(healthChecks(res)); err != nil {
			a.log.Warn("health check servers", "err", err)
		}
	}
	a.warnExternalIPs(res.ExternalIPsIgnored)
	a.saveSnapshot(res, now)
	// IPVS real servers that left the plan drain at weight 0; keep syncing
	// until they are gone, so they are removed when their connections end.
	if d, ok := a.backend.(datapath.Drainer); ok && d.Draining() > 0 {
		a.runner.Run()
	}
	a.syncOnce.Do(func() {
		a.log.Info("first sync done", "frontends", len(res.Plan.Frontends), "took", now.Sub(start).Round(time.Millisecond))
		a.firstSynced.Store(now.UnixNano())
		close(a.synced)
		if err := a.notifier.MarkReady(fmt.Sprintf("programmed %d frontends", len(res.Plan.Frontends))); err != nil {
			a.log.Warn("systemd notify", "err", err)
		}
		// The first snapshot's encoding is start-up garbage too: give it
		// back once that write is done.
		a.snaps.afterWrite(func() { releaseAfterStart(a.log) })
	})
	status := fmt.Sprintf("generation %d: %d frontends", res.Plan.Generation, len(res.Plan.Frontends))
	if a.fromSnapshot.Load() {
		status += " (from the last known state; API server unreachable)"
	}
	_ = a.notifier.Status(status)
}

// kernelWatch is a backend that tells cheaply whether its kernel objects
// are still as its last apply left them (*iptables.Proxier, through the
// tables' fingerprint that its tamper monitor keeps verified).
type kernelWatch interface {
	Unchanged() bool
}

// restWhenQuiet is how long the sync loop may sleep after a quiet compare
// (see decide): kube-proxy's periodic full sync interval in its
// iptables and nftables modes. Everything that can move wakes it sooner: a
// change in the state asks for a sync, and so does the tamper monitor when
// the kernel objects were changed behind our back.
const restWhenQuiet = time.Hour

// mayRest reports whether the loop may rest after a compare (see
// restWhenQuiet): no snapshot write waits for a later sync, no probe
// verdicts are in force, and the backend vouches for its kernel objects
// (kernelWatch) as they are now. Called under a.mu.
func (a *Agent) mayRest() bool {
	if a.snaps.pending() || a.probes != nil && a.probes.active.Load() {
		return false
	}
	w, ok := a.backend.(kernelWatch)
	return ok && w.Unchanged()
}

// syncInput gathers what decide turns on. Called under a.mu.
func (a *Agent) syncInput(snap *state.Snapshot, start time.Time) syncInput {
	in := syncInput{
		changed:    len(snap.Changed) > 0 || snap.NodeChanged,
		generation: snap.Generation, synced: a.syncedGen, compared: a.comparedGen,
		owed: a.needFull, deferred: a.deferred,
		unsettled: !a.planner.Settled() || a.fromSnapshot.Load() != a.syncedOffline ||
			a.probes != nil && (a.probes.active.Load() || a.probingWanted(start)),
	}
	if d, ok := a.backend.(datapath.Drainer); ok && d.Draining() > 0 {
		in.unsettled = true
	}
	period := a.Config().Sync.Period
	in.compareDue = period > 0 && start.Sub(a.lastFull) >= period
	if w, ok := a.backend.(kernelWatch); ok && in.compareDue && !in.owed {
		in.vouched = w.Unchanged() // a fingerprint read: only when it counts
	}
	return in
}

func healthChecks(res *planner.Result) map[uint16]healthcheck.Info {
	out := make(map[uint16]healthcheck.Info, len(res.HealthChecks))
	for port, hc := range res.HealthChecks {
		out[port] = healthcheck.Info{Namespace: hc.Namespace, Name: hc.Name, LocalEndpoints: hc.LocalEndpoints}
	}
	return out
}

// published is what the last successful sync programmed. It is read
// without the sync lock: the debug views never wait for a sync.
type published struct {
	res     *planner.Result
	refused []datapath.Refusal
}

// Last returns the last plan applied with its explanations, or nil.
func (a *Agent) Last() *planner.Result {
	if p := a.last.Load(); p != nil {
		return p.res
	}
	return nil
}

// Refused returns what the last successful sync left out of the datapath,
// and why.
func (a *Agent) Refused() []datapath.Refusal {
	if p := a.last.Load(); p != nil {
		return p.refused
	}
	return nil
}

// warnExternalIPs logs once per Service that its externalIPs are ignored
// (they are opt-in: CVE-2020-8554) and counts it. Called under a.mu.
func (a *Agent) warnExternalIPs(services []string) {
	seen := make(map[string]bool, len(services))
	for _, s := range services {
		seen[s] = true
		if !a.externalIPsWarned[s] {
			a.log.Warn("Service has externalIPs, which are not programmed: set externalIPs: true to use them", "service", s)
			a.metrics.externalIPsIgnored.Inc()
		}
	}
	a.externalIPsWarned = seen
}
