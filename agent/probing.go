package agent

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/agent/prober"
	"github.com/edgeproxy/edgeproxy/agent/source"
	"github.com/edgeproxy/edgeproxy/agent/state"
	"github.com/edgeproxy/edgeproxy/datapath"
)

// probing leaves endpoints that fail their probes out of the plan while
// EndpointSlices cannot be trusted to be fresh (the API server is away),
// or always with health.mode: always.
type probing struct {
	prober *prober.Prober
	active atomic.Bool // verdicts were applied by the last sync
	// left is what the last sync left out; under the agent's mu.
	left leftOut
	// reasons is left as published for status and explain, once applied.
	reasons atomic.Pointer[leftOut]
	// badSpecs remembers, per Service, the offline-probe value last
	// warned about (logged once); under the agent's mu.
	badSpecs map[string]string
}

// newProbing returns nil when health.mode is off. The prober's options
// are read once (restart-only keys); mode and after are read live.
func (a *Agent) newProbing(reg prometheus.Registerer) *probing {
	h := a.Config().Health
	if h.Mode == config.HealthOff {
		return nil
	}
	p := &probing{badSpecs: map[string]string{}}
	p.prober = prober.New(prober.Options{
		Interval: h.Interval, Timeout: h.Timeout,
		FailureThreshold: h.FailureThreshold, SuccessThreshold: h.SuccessThreshold,
		RatePerSecond: h.ProbesPerSecond, Concurrency: h.Concurrency,
		Jitter:   float64(h.JitterPercent) / 100,
		OnChange: func() { a.runner.Run() },
		Dial:     a.opts.ProbeDial,
	})
	if reg != nil && h.PerEndpointMetrics {
		reg.MustRegister(perEndpoint{p.prober})
	}
	if reg != nil {
		for _, s := range prober.States {
			reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name:        "edgeproxy_endpoint_probe_state",
				Help:        "Probed endpoints by state (probing runs while the API server is away, or always with health.mode: always).",
				ConstLabels: prometheus.Labels{"state": s.String()},
			}, func() float64 { return float64(p.prober.Counts()[s]) }))
		}
	}
	return p
}

// perEndpoint exports one series per probed endpoint, the value 1 under
// its state's label (health.perEndpointMetrics: as many series as
// endpoints, so off by default).
type perEndpoint struct{ prober *prober.Prober }

var perEndpointDesc = prometheus.NewDesc("edgeproxy_endpoint_probe_target_state",
	"Each probed endpoint (address:port, /udp for UDP probes) with 1 under its state.",
	[]string{"target", "state"}, nil)

func (perEndpoint) Describe(ch chan<- *prometheus.Desc) { ch <- perEndpointDesc }

func (c perEndpoint) Collect(ch chan<- prometheus.Metric) {
	for t, v := range c.prober.Verdicts() {
		ch <- prometheus.MustNewConstMetric(perEndpointDesc, prometheus.GaugeValue, 1, t.String(), v.State.String())
	}
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
	if a.api.Reachable() {
		return false
	}
	// Only now: with a Link, the last contact is read from the kernel.
	last := a.api.LastContact()
	return !last.IsZero() && now.Sub(last) >= h.After
}

// runProbing runs the prober and asks for a sync when probing starts or
// stops being wanted, until ctx is done. It sleeps until that can change:
// the API server stops or starts answering (the heartbeat says so), or
// health.after has passed since it was last heard from. Config reloads and
// the end of a start from the snapshot request a sync themselves, and
// every sync checks again.
func (a *Agent) runProbing(ctx context.Context) {
	done := make(chan struct{})
	go func() { a.probes.prober.Run(ctx); close(done) }()
	defer func() { <-done }() // bounded: a probe in flight ends by its timeout
	var reach <-chan struct{}
	if a.api != nil {
		reach = a.api.ReachabilityChanged()
	}
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		now := time.Now()
		if a.probingWanted(now) != a.probes.active.Load() {
			a.runner.Run()
		}
		t.Reset(a.probingCheckIn(now))
		select {
		case <-ctx.Done():
			return
		case <-reach:
		case <-t.C:
		}
	}
}

// probingCheckIn is how long runProbing may sleep before probingWanted
// can change without a signal: once health.after has passed since the
// last contact while the API server does not answer; a minute otherwise,
// a backstop for a health.after changed by a reload.
func (a *Agent) probingCheckIn(now time.Time) time.Duration {
	const backstop = time.Minute
	h := a.Config().Health
	if h.Mode != config.HealthOffline || a.api == nil || a.api.Reachable() {
		return backstop
	}
	last := a.api.LastContact()
	if last.IsZero() {
		return backstop
	}
	if d := last.Add(h.After).Sub(now); d > 0 {
		return min(d+10*time.Millisecond, backstop)
	}
	// Already due: a sync was asked for (or is not needed); the next
	// change is the API server answering again.
	return backstop
}

// AnnotationOfflineProbe chooses how a Service's endpoints are probed:
// "false" never (they are never left out), "true" or absent the default
// (TCP service ports, at the target port), "PORT", "PORT/tcp" or
// "PORT/udp" that port and protocol on each endpoint's address instead,
// for every protocol of the Service (a UDP Service is probed only so).
// The source checks it when it reads the Service (source.ParseOfflineProbe).
const AnnotationOfflineProbe = source.AnnotationOfflineProbe

// probeSpec is one Service's parsed edgeproxy.io/offline-probe.
type probeSpec struct {
	off  bool
	port uint16 // 0: each endpoint's own (target) port, TCP ports only
	udp  bool
}

// parseProbeSpec parses an edgeproxy.io/offline-probe value.
func parseProbeSpec(v string) (probeSpec, error) {
	p, err := source.ParseOfflineProbe(v)
	return probeSpec{off: p.Off, port: p.Port, udp: p.UDP}, err
}

// target returns what probes endpoint e of a frontend of protocol proto,
// and false when it is not probed.
func (s probeSpec) target(e netip.AddrPort, proto datapath.Protocol) (prober.Target, bool) {
	switch {
	case s.off:
		return prober.Target{}, false
	case s.port != 0:
		return prober.Target{Addr: netip.AddrPortFrom(e.Addr(), s.port), UDP: s.udp}, true
	case proto == datapath.TCP:
		return prober.Target{Addr: e}, true
	}
	return prober.Target{}, false
}

// probeSpecs returns the probe spec of every service port of snap whose
// Service sets edgeproxy.io/offline-probe, keyed as Frontend.Service. The
// source leaves out a value that does not parse; one that reaches here
// anyway (a snapshot written before it did) is logged once per Service
// and value, again after a good one, and the default applies.
func (a *Agent) probeSpecs(snap *state.Snapshot) map[model.ServicePortName]probeSpec {
	out := map[model.ServicePortName]probeSpec{}
	for name, port := range snap.Ports {
		svc := port.Service.Namespace + "/" + port.Service.Name
		v, ok := port.Service.Annotations[AnnotationOfflineProbe]
		spec, err := parseProbeSpec(v)
		if err == nil {
			delete(a.probes.badSpecs, svc)
		} else if a.probes.badSpecs[svc] != v {
			a.probes.badSpecs[svc] = v
			a.log.Warn("Service annotation ignored, probing as by default", "service", svc, "err", err)
		}
		if ok {
			out[name] = spec
		}
	}
	return out
}

// applyProbeVerdicts leaves failed endpoints out of plan (a copy of each
// frontend it changes: the planner may keep its frontends) and sets the
// prober's targets to what the plan's endpoints probe as. Once probing is
// no longer wanted (the API server is back), every verdict is dropped in
// this same sync. It reports whether what is left out changed, which makes
// this sync a full one (the frontends it changed are not in plan.Changed).
// Called under a.mu.
func (a *Agent) applyProbeVerdicts(plan *datapath.Plan, snap *state.Snapshot) bool {
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
	specs := a.probeSpecs(snap)
	p.prober.SetTargets(probeTargets(plan, specs))
	left := leftOut{}
	for i := range plan.Frontends {
		f := &plan.Frontends[i]
		spec := specs[f.Service]
		eps, lo := p.filter(f, spec, f.Endpoints, left)
		cl, cco := p.filter(f, spec, f.Cluster, left)
		if lo || cco {
			g := *f
			g.Endpoints, g.Cluster = eps, cl
			plan.Frontends[i] = g
		}
	}
	return p.setLeft(left)
}

// leftOut is what one sync left out: per service port, each endpoint with
// its verdict.
type leftOut map[model.ServicePortName]map[netip.AddrPort]prober.Verdict

// filter returns eps of frontend f without the failed endpoints, all of
// them when every one failed, and whether it left any out; what it leaves
// out goes to left.
func (p *probing) filter(f *datapath.Frontend, spec probeSpec, eps []datapath.Endpoint, left leftOut) ([]datapath.Endpoint, bool) {
	failed := make([]bool, len(eps))
	verdicts := make([]prober.Verdict, len(eps))
	any := false
	for i, e := range eps {
		if t, ok := spec.target(e.Addr, f.Protocol); ok {
			verdicts[i] = p.prober.Verdict(t)
		}
		failed[i] = verdicts[i].State == prober.Failed
		any = any || failed[i]
	}
	if !any {
		return eps, false
	}
	keep := prober.Keep(failed)
	out := make([]datapath.Endpoint, 0, len(eps))
	for i, e := range eps {
		if keep[i] {
			out = append(out, e)
			continue
		}
		if left[f.Service] == nil {
			left[f.Service] = map[netip.AddrPort]prober.Verdict{}
		}
		left[f.Service][e.Addr] = verdicts[i]
	}
	return out, len(out) != len(eps)
}

// setLeft records what this sync leaves out and reports whether it
// changed since the last sync.
func (p *probing) setLeft(left leftOut) bool {
	changed := len(left) != len(p.left)
	for svc, eps := range left {
		was := p.left[svc]
		changed = changed || len(eps) != len(was)
		for a := range eps {
			if _, ok := was[a]; !ok {
				changed = true
			}
		}
	}
	p.left = left
	return changed
}

// publish makes what the last sync left out visible to status and
// explain; called once that sync's plan is in the kernel.
func (p *probing) publish() {
	if p == nil {
		return
	}
	left := p.left
	p.reasons.Store(&left)
}

// ProbeVerdicts returns what the last sync left out because of probes:
// per service port, each endpoint with its verdict; nil when nothing.
func (a *Agent) ProbeVerdicts() map[model.ServicePortName]map[netip.AddrPort]prober.Verdict {
	if a.probes == nil {
		return nil
	}
	if m := a.probes.reasons.Load(); m != nil {
		return *m
	}
	return nil
}

// probeNotes returns explain's notes for the endpoints of service port
// svc that the last sync left out because of their probes.
func (a *Agent) probeNotes(svc model.ServicePortName) []string {
	eps := a.ProbeVerdicts()[svc]
	notes := make([]string, 0, len(eps))
	for addr, v := range eps {
		notes = append(notes, fmt.Sprintf("endpoint %s left out: %s", addr, v.Reason()))
	}
	slices.Sort(notes)
	return notes
}

// probeTargets lists, once each, what the plan's endpoints probe as.
func probeTargets(plan *datapath.Plan, specs map[model.ServicePortName]probeSpec) []prober.Target {
	seen := map[prober.Target]bool{}
	var out []prober.Target
	for _, f := range plan.Frontends {
		spec := specs[f.Service]
		for _, list := range [][]datapath.Endpoint{f.Endpoints, f.Cluster} {
			for _, e := range list {
				if t, ok := spec.target(e.Addr, f.Protocol); ok && !seen[t] {
					seen[t] = true
					out = append(out, t)
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
	for _, eps := range a.ProbeVerdicts() {
		for addr, v := range eps {
			if st.LeftOut == nil {
				st.LeftOut = map[string]string{}
			}
			st.LeftOut[addr.String()] = v.Reason()
		}
	}
	return st
}
