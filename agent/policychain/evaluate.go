package policychain

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/policy"
	"github.com/edgeproxy/edgeproxy/policy/abi"
)

// Verdict is the outcome of evaluating one service port.
type Verdict struct {
	// Weights holds one weight per input endpoint, in order; 0 drops the
	// endpoint. All 1 when no chain matched or keep-builtin applied.
	Weights []uint32 `json:"weights"`
	// Scheduler and SchedulerFlags are the IPVS scheduler chosen by the
	// chain (the last module that chose one); empty keeps the default.
	Scheduler      string   `json:"scheduler,omitempty"`
	SchedulerFlags []string `json:"schedulerFlags,omitempty"`
	// Chain names the chain that ran; empty when none matched.
	Chain string `json:"chain,omitempty"`
	// Steps are the modules' verdicts, in chain order, up to the first
	// failure.
	Steps []Step `json:"steps,omitempty"`
	// Fallback is the failure policy applied (config.FailureKeepBuiltin or config.FailureLastGood)
	// when a module failed; empty otherwise.
	Fallback string `json:"fallback,omitempty"`
	// Shadows are the shadow modules' answers, in chain order; never
	// used for Weights.
	Shadows []Shadow `json:"shadows,omitempty"`
}

// Step is one module's verdict.
type Step struct {
	Module string `json:"module"`
	// Weights maps the module's output back onto the Evaluate input:
	// one per input endpoint, 0 for endpoints dropped here or earlier.
	// Nil when the module failed.
	Weights []uint32 `json:"weights,omitempty"`
	// Failure is the failure reason (trap, timeout, invalid,
	// circuit_open); empty on success. Error has the detail.
	Failure policy.Reason `json:"failure,omitempty"`
	Error   string        `json:"error,omitempty"`
	// Reason is the module's own explanation.
	Reason    string        `json:"reason,omitempty"`
	Scheduler string        `json:"scheduler,omitempty"`
	Cached    bool          `json:"cached,omitempty"`
	Duration  time.Duration `json:"durationNs,omitempty"`
}

// String renders a verdict on one line for logs and the explain view.
func (v Verdict) String() string {
	if v.Chain == "" {
		return "no chain"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "chain %s:", v.Chain)
	for _, s := range v.Steps {
		if s.Failure != "" {
			fmt.Fprintf(&b, " %s FAILED %s (%s);", s.Module, s.Failure, s.Error)
			continue
		}
		fmt.Fprintf(&b, " %s %v", s.Module, s.Weights)
		if s.Scheduler != "" {
			fmt.Fprintf(&b, " sched=%s", s.Scheduler)
		}
		if s.Reason != "" {
			fmt.Fprintf(&b, " %q", s.Reason)
		}
		b.WriteString(";")
	}
	if v.Fallback != "" {
		fmt.Fprintf(&b, " fallback=%s", v.Fallback)
	}
	fmt.Fprintf(&b, " -> %v", v.Weights)
	if v.Scheduler != "" {
		fmt.Fprintf(&b, " sched=%s", v.Scheduler)
		if len(v.SchedulerFlags) > 0 {
			fmt.Fprintf(&b, "(%s)", strings.Join(v.SchedulerFlags, ","))
		}
	}
	for _, s := range v.Shadows {
		fmt.Fprintf(&b, "; shadow %s of %s: %s", s.Module, s.Of, s.Summary())
	}
	return b.String()
}

// Evaluate runs the first chain matching svc on eps, the endpoints of port
// after built-in selection (internal and external choices together), and
// returns a weight per endpoint. Modules are called only when their input
// changed since they last answered it (each module caches by input hash).
// It never fails: a failing module gets its chain's failure policy.
func (e *Evaluator) Evaluate(ctx context.Context, svc *model.Service, port model.ServicePort, node *model.Node, eps []model.PortEndpoint) Verdict {
	return e.EvaluateBatch(ctx, []Request{{Service: svc, Port: port, Node: node, Endpoints: eps}})[0]
}

// Request is one service port to evaluate: its endpoints after built-in
// selection.
type Request struct {
	Service   *model.Service
	Port      model.ServicePort
	Node      *model.Node
	Endpoints []model.PortEndpoint
}

// EvaluateBatch is Evaluate for many service ports at once, one Verdict
// per request in order. The requests of each chain go through it step by
// step, each step's module called with all of them together
// (policy.Instance.EvaluateBatch: one call per batch when the module
// exports ep_evaluate_batch); each port keeps its own result, cache entry
// and failure policy, and one port's failure does not touch another's.
func (e *Evaluator) EvaluateBatch(ctx context.Context, reqs []Request) []Verdict {
	l := e.acquire()
	defer l.release()
	out := make([]Verdict, len(reqs))
	var groups map[*chain][]int
	for k := range reqs {
		var ch *chain
		if l != nil {
			for _, c := range l.chains {
				if matches(c.cfg.Match, reqs[k].Service) {
					ch = c
					break
				}
			}
		}
		if ch == nil {
			out[k] = Verdict{Weights: model.EqualWeights(len(reqs[k].Endpoints))}
			continue
		}
		if groups == nil {
			groups = make(map[*chain][]int)
		}
		groups[ch] = append(groups[ch], k)
	}
	if groups == nil {
		return out
	}
	b := budgetFrom(ctx, l.budget())
	for _, ch := range l.chains {
		if idx := groups[ch]; len(idx) > 0 {
			e.runChain(ctx, l, ch, reqs, idx, out, b)
		}
	}
	return out
}

// job is one service port going through a chain.
type job struct {
	k         int // index of the request
	spn       model.ServicePortName
	in        abi.Input
	weights   []uint32
	idx       []int // for each input endpoint of the current step, its request endpoint
	allCached bool
	done      bool // a step failed: out[k] holds the fallback
}

// runChain runs ch on the requests at idx and writes their verdicts; each
// step's shadows run right after it, within the budget b.
func (e *Evaluator) runChain(ctx context.Context, l *loaded, ch *chain, reqs []Request, idx []int, out []Verdict, b *shadowBudget) {
	jobs := make([]job, len(idx))
	for j, k := range idx {
		r := &reqs[k]
		jobs[j] = job{k: k, spn: model.ServicePortName{Namespace: r.Service.Namespace, Name: r.Service.Name, Port: r.Port.Name},
			in: l.opts.input(r.Service, r.Port, r.Node), weights: model.EqualWeights(len(r.Endpoints)), allCached: true}
		jobs[j].in.Endpoints = make([]abi.Endpoint, 0, len(r.Endpoints))
		out[k] = Verdict{Chain: ch.cfg.Name}
	}
	ins := make([]*abi.Input, 0, len(jobs))
	live := make([]*job, 0, len(jobs))
	for si := range ch.steps {
		st := &ch.steps[si]
		ins, live = stepInputs(jobs, reqs, ins[:0], live[:0])
		if len(ins) == 0 {
			break
		}
		st.calls.Add(float64(len(ins)))
		results := st.inst.EvaluateBatch(ctx, ins)
		for n, res := range results {
			e.takeResult(ch, st, live[n], res, reqs, out)
		}
		if len(st.shadows) > 0 {
			e.runShadows(ctx, l, ch, st, ins, live, results, out, b)
		}
	}
	for j := range jobs {
		jb := &jobs[j]
		if jb.done {
			continue
		}
		out[jb.k].Weights = jb.weights
		if !jb.allCached { // a fully cached answer is the one already remembered
			e.rememberGood(ch, jb, reqs[jb.k].Endpoints, &out[jb.k])
		}
	}
}

// stepInputs builds the next step's input of every job still running: the
// endpoints the chain so far left a weight, with that weight.
func stepInputs(jobs []job, reqs []Request, ins []*abi.Input, live []*job) ([]*abi.Input, []*job) {
	for j := range jobs {
		jb := &jobs[j]
		if jb.done {
			continue
		}
		eps, node := reqs[jb.k].Endpoints, reqs[jb.k].Node
		jb.idx, jb.in.Endpoints = jb.idx[:0], jb.in.Endpoints[:0]
		for i := range eps {
			if jb.weights[i] > 0 {
				jb.idx = append(jb.idx, i)
				jb.in.Endpoints = append(jb.in.Endpoints, endpoint(&eps[i], node, jb.weights[i]))
			}
		}
		ins, live = append(ins, &jb.in), append(live, jb)
	}
	return ins, live
}

// takeResult records step st's result for job jb in its verdict: the new
// weights, or the chain's fallback when the step failed.
func (e *Evaluator) takeResult(ch *chain, st *step, jb *job, res policy.BatchResult, reqs []Request, out []Verdict) {
	v := &out[jb.k]
	s := Step{Module: st.module, Cached: res.Cached, Duration: res.Duration}
	jb.allCached = jb.allCached && res.Cached
	if res.Cached {
		st.cacheHits.Inc()
	} else if res.Duration > 0 {
		st.duration.Observe(res.Duration.Seconds())
	}
	if res.Err != nil {
		s.Failure, s.Error = policy.ReasonOf(res.Err), res.Err.Error()
		if s.Failure == "" {
			s.Failure = policy.ReasonTrap
		}
		v.Steps = append(v.Steps, s)
		*v = e.fallback(ch, jb.spn, *v, reqs[jb.k].Endpoints, s, res.Err)
		jb.done = true
		return
	}
	next := make([]uint32, len(jb.weights))
	for i, ei := range jb.idx {
		next[ei] = res.Output.Weights[i]
	}
	jb.weights = next
	s.Weights, s.Reason, s.Scheduler = slices.Clone(next), res.Output.Reason, res.Output.Scheduler
	if res.Output.Scheduler != "" {
		v.Scheduler, v.SchedulerFlags = res.Output.Scheduler, res.Output.SchedulerFlags
	}
	v.Steps = append(v.Steps, s)
}

// rememberGood keeps a job's finished verdict as the chain's last good
// output for its service port (failure: last-good).
func (e *Evaluator) rememberGood(ch *chain, jb *job, eps []model.PortEndpoint, v *Verdict) {
	lg := lastGood{addrs: make([]netip.AddrPort, len(eps)), weights: jb.weights, scheduler: v.Scheduler, flags: v.SchedulerFlags}
	for i := range eps {
		lg.addrs[i] = eps[i].AddrPort()
	}
	e.lgMu.Lock()
	e.lastGood[lastGoodKey{ch.cfg.Name, jb.spn}] = lg
	e.lgMu.Unlock()
}

// fallback applies the chain's failure policy after step s failed.
func (e *Evaluator) fallback(ch *chain, spn model.ServicePortName, v Verdict, eps []model.PortEndpoint, s Step, err error) Verdict {
	v.Fallback = config.FailureKeepBuiltin
	v.Weights = model.EqualWeights(len(eps))
	v.Scheduler, v.SchedulerFlags = "", nil
	if ch.cfg.Failure == config.FailureLastGood {
		e.lgMu.Lock()
		lg, ok := e.lastGood[lastGoodKey{ch.cfg.Name, spn}]
		e.lgMu.Unlock()
		if ok {
			byAddr := make(map[netip.AddrPort]uint32, len(lg.addrs))
			for i, a := range lg.addrs {
				byAddr[a] = lg.weights[i]
			}
			w := make([]uint32, len(eps))
			any := false
			for i := range eps {
				w[i] = byAddr[eps[i].AddrPort()]
				any = any || w[i] > 0
			}
			// The last good answer may not know today's endpoints; it is
			// used only if it keeps the service non-empty (or may empty it).
			if any || ch.cfg.AllowEmpty || len(eps) == 0 {
				v.Fallback, v.Weights, v.Scheduler, v.SchedulerFlags = config.FailureLastGood, w, lg.scheduler, lg.flags
			}
		}
	}
	e.metrics.failures.WithLabelValues(s.Module, string(s.Failure)).Inc()
	e.metrics.fallbacks.WithLabelValues(ch.cfg.Name, v.Fallback).Inc()
	level := slog.LevelWarn
	if s.Failure == policy.ReasonCircuitOpen {
		level = slog.LevelDebug // already reported when it opened
	}
	e.log.Log(context.Background(), level, "policy: module failed; failure policy applied",
		"service", spn.String(), "chain", ch.cfg.Name, "module", s.Module,
		"reason", string(s.Failure), "policy", v.Fallback, "err", err)
	return v
}

func matches(m config.Match, svc *model.Service) bool {
	if len(m.Namespaces) > 0 && !slices.Contains(m.Namespaces, svc.Namespace) {
		return false
	}
	for k, want := range m.Labels {
		if got, ok := svc.Labels[k]; !ok || got != want {
			return false
		}
	}
	for k, want := range m.Annotations {
		if got, ok := svc.Annotations[k]; !ok || got != want {
			return false
		}
	}
	return true
}

func (o *options) input(svc *model.Service, port model.ServicePort, node *model.Node) abi.Input {
	in := abi.Input{
		Service: abi.Service{
			Namespace: svc.Namespace, Name: svc.Name, PortName: port.Name, Protocol: port.Protocol, Port: port.Port,
			Labels:      withPrefix(svc.Labels, o.prefix),
			Annotations: withPrefix(svc.Annotations, o.prefix),
		},
	}
	if node != nil {
		in.Node = abi.Node{Name: node.Name, Zone: node.Zone, Region: node.Region}
		for _, k := range o.nodeLabels {
			if v, ok := node.Labels[k]; ok {
				in.Node.Labels = append(in.Node.Labels, abi.KV{Key: k, Value: v})
			}
		}
		slices.SortFunc(in.Node.Labels, func(a, b abi.KV) int { return strings.Compare(a.Key, b.Key) })
	}
	return in
}

func withPrefix(m map[string]string, prefix string) []abi.KV {
	var out []abi.KV
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if strings.HasPrefix(k, prefix) {
			out = append(out, abi.KV{Key: k, Value: m[k]})
		}
	}
	return out
}

func endpoint(e *model.PortEndpoint, node *model.Node, w uint32) abi.Endpoint {
	return abi.Endpoint{
		Addr: e.Addr, Port: e.Port, NodeName: e.NodeName, Zone: e.Zone,
		Ready: e.Ready, Serving: e.Serving, Terminating: e.Terminating,
		Local:     node != nil && e.NodeName != "" && e.NodeName == node.Name,
		HintZones: e.HintZones(), HintNodes: e.HintNodes(), Weight: w,
	}
}
