package agent

import (
	"context"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/health"
	"github.com/edgeproxy/edgeproxy/datapath"
)

// probing leaves endpoints that fail their probes out of the plan while
// EndpointSlices cannot be trusted to be fresh (the API server is away),
// or always with health.mode: always.
type probing struct {
	prober *health.Prober
	active atomic.Bool // verdicts were applied by the last sync
	// left is what the last sync left out; under the agent's mu.
	left map[netip.AddrPort]health.Verdict
	// reasons is left as published for status and explain.
	reasons atomic.Pointer[map[netip.AddrPort]health.Verdict]
}

// newProbing returns nil when health.mode is off. The prober's options
// are read once (restart-only keys); mode and after are read live.
func (a *Agent) newProbing(reg prometheus.Registerer) *probing {
	h := a.Config().Health
	if h.Mode == config.HealthOff {
		return nil
	}
	p := &probing{}
	p.prober = health.New(health.Options{
		Interval: h.Interval, Timeout: h.Timeout,
		FailureThreshold: h.FailureThreshold, SuccessThreshold: h.SuccessThreshold,
		RatePerSecond: h.ProbesPerSecond, Concurrency: h.Concurrency,
		Jitter:   float64(h.JitterPercent) / 100,
		OnChange: func() { a.runner.Run() },
		Dial:     a.opts.ProbeDial,
	})
	if reg != nil {
		for _, s := range health.States {
			reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name:        "edgeproxy_endpoint_probe_state",
				Help:        "Probed endpoints by state (probing runs while the API server is away, or always with health.mode: always).",
				ConstLabels: prometheus.Labels{"state": s.String()},
			}, func() float64 { return float64(p.prober.Counts()[s]) }))
		}
	}
	return p
}

// probingWanted reports whether verdicts apply now: always, or in offline
// mode after a start from the snapshot or once the API server has not
// answered for health.after.
func (a *Agent) probingWanted(now time.Time) bool {
	h := a.Config().Health
	switch {
	case h.Mode == config.HealthAlways:
		return true
	case h.Mode != config.HealthOffline || a.api == nil:
		return false
	case a.fromSnapshot.Load():
		return true
	}
	last := a.api.LastContact()
	return !a.api.Reachable() && !last.IsZero() && now.Sub(last) >= h.After
}

// runProbing runs the prober and asks for a sync when probing starts or
// stops being wanted, until ctx is done.
func (a *Agent) runProbing(ctx context.Context) {
	done := make(chan struct{})
	go func() { a.probes.prober.Run(ctx); close(done) }()
	defer func() { <-done }() // bounded: a probe in flight ends by its timeout
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if a.probingWanted(time.Now()) != a.probes.active.Load() {
			a.runner.Run()
		}
	}
}

// applyProbeVerdicts leaves failed endpoints out of plan (a copy of each
// frontend it changes: the planner may keep its frontends) and sets the
// prober's targets to the plan's TCP endpoints. Once probing is no longer
// wanted (the API server is back), every verdict is dropped in this same
// sync. It reports whether what is left out changed, which makes this
// sync a full one (the frontends it changed are not in plan.Changed).
// Called under a.mu.
func (a *Agent) applyProbeVerdicts(plan *datapath.Plan) bool {
	p := a.probes
	if p == nil {
		return false
	}
	if !a.probingWanted(time.Now()) {
		p.prober.SetTargets(nil)
		p.prober.Reset()
		p.active.Store(false)
		return p.setLeft(nil)
	}
	p.active.Store(true)
	p.prober.SetTargets(tcpEndpoints(plan))
	left := map[netip.AddrPort]health.Verdict{}
	for i := range plan.Frontends {
		f := &plan.Frontends[i]
		if f.Protocol != datapath.TCP {
			continue
		}
		eps, lo := p.filter(f.Endpoints, left)
		cl, cco := p.filter(f.Cluster, left)
		if lo || cco {
			g := *f
			g.Endpoints, g.Cluster = eps, cl
			plan.Frontends[i] = g
		}
	}
	return p.setLeft(left)
}

// filter returns eps without the failed endpoints, all of them when every
// one failed, and whether it left any out; what it leaves out goes to left.
func (p *probing) filter(eps []datapath.Endpoint, left map[netip.AddrPort]health.Verdict) ([]datapath.Endpoint, bool) {
	failed := make([]bool, len(eps))
	verdicts := make([]health.Verdict, len(eps))
	any := false
	for i, e := range eps {
		verdicts[i] = p.prober.Verdict(e.Addr)
		failed[i] = verdicts[i].State == health.Failed
		any = any || failed[i]
	}
	if !any {
		return eps, false
	}
	keep := health.Keep(failed)
	out := make([]datapath.Endpoint, 0, len(eps))
	for i, e := range eps {
		if keep[i] {
			out = append(out, e)
		} else {
			left[e.Addr] = verdicts[i]
		}
	}
	return out, len(out) != len(eps)
}

// setLeft records what this sync leaves out and reports whether the set
// of endpoints changed since the last sync.
func (p *probing) setLeft(left map[netip.AddrPort]health.Verdict) bool {
	changed := len(left) != len(p.left)
	for a := range left {
		if _, ok := p.left[a]; !ok {
			changed = true
		}
	}
	p.left = left
	p.reasons.Store(&left)
	return changed
}

// ProbeVerdicts returns the endpoints the last sync left out because of
// their probes, with the reason; nil when none.
func (a *Agent) ProbeVerdicts() map[netip.AddrPort]health.Verdict {
	if a.probes == nil {
		return nil
	}
	if m := a.probes.reasons.Load(); m != nil {
		return *m
	}
	return nil
}

func tcpEndpoints(plan *datapath.Plan) []netip.AddrPort {
	seen := map[netip.AddrPort]bool{}
	var out []netip.AddrPort
	for _, f := range plan.Frontends {
		if f.Protocol != datapath.TCP {
			continue
		}
		for _, list := range [][]datapath.Endpoint{f.Endpoints, f.Cluster} {
			for _, e := range list {
				if !seen[e.Addr] {
					seen[e.Addr] = true
					out = append(out, e.Addr)
				}
			}
		}
	}
	return out
}

// ProbeStatus is the probing part of /debug/status.
type ProbeStatus struct {
	// Active: the last sync applied probe verdicts.
	Active bool `json:"active"`
	// States counts the probed endpoints by state.
	States map[string]int `json:"states"`
	// LeftOut names each endpoint the last sync left out, with the reason
	// ("probe: 3 failures since 12:04:31 (...)").
	LeftOut map[string]string `json:"leftOut,omitempty"`
}

func (a *Agent) probeStatus() *ProbeStatus {
	if a.probes == nil {
		return nil
	}
	st := &ProbeStatus{Active: a.probes.active.Load(), States: map[string]int{}}
	for s, n := range a.probes.prober.Counts() {
		st.States[s.String()] = n
	}
	for addr, v := range a.ProbeVerdicts() {
		if st.LeftOut == nil {
			st.LeftOut = map[string]string{}
		}
		st.LeftOut[addr.String()] = v.Reason()
	}
	return st
}
