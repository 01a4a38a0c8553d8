package policychain

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/policy"
	"github.com/edgeproxy/edgeproxy/policy/abi"
)

// A shadow module (config.Module.ShadowOf) runs after the module it
// shadows, in each chain step of that module, on the very inputs the step
// got. Its answers go through the same checks as a live module's and are
// compared with the step's; they are never used. It is its own
// policy.Instance, so its cache, breaker and failures are its own and
// never reach the chain's result, last-good answers or failure policy.

// DefaultShadowBudget is the shadow time of one sync when
// config.Policy.ShadowBudget is 0.
const DefaultShadowBudget = 100 * time.Millisecond

// ShadowHistory is how many differences the Evaluator keeps.
const ShadowHistory = 64

// Shadow failure reasons beyond policy's: the sync's shadow budget was
// spent before the shadow ran (or while it ran), or the module did not
// load.
const (
	ShadowSkipped = "skipped"
	ShadowLoad    = "load"
)

// shadowStep is one shadow of one chain step.
type shadowStep struct {
	module, of string
	inst       *policy.Instance // nil when it did not load
	loadErr    string
	compared   prometheus.Counter
	diffs      prometheus.Counter
	// skipped counts the evaluations skipped for want of shadow budget
	// since this generation was loaded (ModuleStatus.Skipped).
	skipped *atomic.Uint64
}

// Shadow is one shadow's answer for a service port, in Verdict.Shadows.
type Shadow struct {
	Module string `json:"module"`
	Of     string `json:"of"`
	// Weights maps the shadow's output onto the Evaluate input, as
	// Step.Weights does; nil when it failed.
	Weights   []uint32 `json:"weights,omitempty"`
	Scheduler string   `json:"scheduler,omitempty"`
	Reason    string   `json:"reason,omitempty"`
	// Failure is a policy.Reason or ShadowSkipped; Error has the detail.
	Failure string `json:"failure,omitempty"`
	Error   string `json:"error,omitempty"`
	// Diff says how its answer differs from the shadowed module's; empty
	// when they agree (or the shadow failed).
	Diff string `json:"diff,omitempty"`
	// InputSHA256 is the hash of the input both answered, set with Diff.
	InputSHA256 string `json:"inputSha256,omitempty"`
	Cached      bool   `json:"cached,omitempty"`
}

// Summary renders the shadow's answer for Verdict.String and explain.
func (s Shadow) Summary() string {
	switch {
	case s.Failure != "":
		return fmt.Sprintf("FAILED %s (%s)", s.Failure, s.Error)
	case s.Diff != "":
		return fmt.Sprintf("%v differs (%s) input %s", s.Weights, s.Diff, shortHash(s.InputSHA256))
	}
	return fmt.Sprintf("%v agrees", s.Weights)
}

func shortHash(h string) string { return h[:min(len(h), 12)] }

// ShadowOutput is one module's answer in a ShadowDiff: weights by the
// input's endpoints.
type ShadowOutput struct {
	Weights        []uint32 `json:"weights,omitempty"`
	Scheduler      string   `json:"scheduler,omitempty"`
	SchedulerFlags []string `json:"schedulerFlags,omitempty"`
	Reason         string   `json:"reason,omitempty"`
	Failure        string   `json:"failure,omitempty"`
	Error          string   `json:"error,omitempty"`
}

// ShadowDiff is one recorded difference between a shadow and the module it
// shadows, on one input.
type ShadowDiff struct {
	Time        time.Time             `json:"time"`
	Service     model.ServicePortName `json:"service"`
	Chain       string                `json:"chain"`
	Module      string                `json:"module"`
	Of          string                `json:"of"`
	InputSHA256 string                `json:"inputSha256"`
	Endpoints   []string              `json:"endpoints"` // the input's, in order
	Active      ShadowOutput          `json:"active"`
	Shadow      ShadowOutput          `json:"shadow"`
	Reason      string                `json:"reason"`
}

// ShadowStatus is one loaded shadow and its counts since the agent
// started.
type ShadowStatus struct {
	Chain   string `json:"chain"`
	Module  string `json:"module"`
	Of      string `json:"of"`
	SHA256  string `json:"sha256,omitempty"`
	Loaded  bool   `json:"loaded"`
	LoadErr string `json:"loadError,omitempty"`
	// Compared counts the answers compared, Differences those that
	// differed, Failures the failed or skipped evaluations by reason.
	Compared    uint64            `json:"compared"`
	Differences uint64            `json:"differences"`
	Failures    map[string]uint64 `json:"failures,omitempty"`
	LastFailure string            `json:"lastFailure,omitempty"`
}

// ShadowReport is the /debug/shadow answer.
type ShadowReport struct {
	Budget  time.Duration  `json:"budgetNs"`
	Modules []ShadowStatus `json:"modules"`
	// Diffs are the latest differences, oldest first, at most
	// ShadowHistory.
	Diffs []ShadowDiff `json:"diffs"`
}

// shadowLog is what the Evaluator remembers of its shadows, across
// reloads.
type shadowLog struct {
	mu    sync.Mutex
	ring  []ShadowDiff // at most ShadowHistory, next at head once full
	head  int
	stats map[string]*shadowStats // by shadow module
}

type shadowStats struct {
	compared, diffs uint64
	failures        map[string]uint64
	last            string
}

func (l *shadowLog) stat(module string) *shadowStats {
	if l.stats == nil {
		l.stats = map[string]*shadowStats{}
	}
	s := l.stats[module]
	if s == nil {
		s = &shadowStats{failures: map[string]uint64{}}
		l.stats[module] = s
	}
	return s
}

// keepOnly forgets the differences and counts of every shadow that is
// not one of gen's (nil: of every shadow): a removed shadow's differences
// are not shown as if it still ran.
func (l *shadowLog) keepOnly(gen *loaded) {
	type key struct{ module, of string }
	keep := map[key]bool{}
	modules := map[string]bool{}
	if gen != nil {
		for _, c := range gen.chains {
			for _, st := range c.steps {
				for _, sh := range st.shadows {
					keep[key{sh.module, sh.of}], modules[sh.module] = true, true
				}
			}
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var ring []ShadowDiff
	for _, d := range l.diffs() {
		if keep[key{d.Module, d.Of}] {
			ring = append(ring, d)
		}
	}
	l.ring, l.head = ring, 0
	for m := range l.stats {
		if !modules[m] {
			delete(l.stats, m)
		}
	}
}

func (l *shadowLog) add(d ShadowDiff) {
	if len(l.ring) < ShadowHistory {
		l.ring = append(l.ring, d)
		return
	}
	l.ring[l.head] = d
	l.head = (l.head + 1) % ShadowHistory
}

// diffs returns the ring oldest first.
func (l *shadowLog) diffs() []ShadowDiff {
	return append(slices.Clone(l.ring[l.head:]), l.ring[:l.head]...)
}

// shadowBudget is the shadow time left to one sync.
type shadowBudget struct {
	mu   sync.Mutex
	left time.Duration
	set  bool // left was initialised from the policy
}

type budgetKey struct{}

// WithShadowBudget returns a context whose EvaluateBatch calls share one
// shadow budget (config.Policy.ShadowBudget): the agent wraps each sync's
// context with it, because a sync weighs its ports in several batches.
// Without it every EvaluateBatch call has a budget of its own.
func WithShadowBudget(ctx context.Context) context.Context {
	return context.WithValue(ctx, budgetKey{}, &shadowBudget{})
}

func budgetFrom(ctx context.Context, limit time.Duration) *shadowBudget {
	b, _ := ctx.Value(budgetKey{}).(*shadowBudget)
	if b == nil {
		b = &shadowBudget{}
	}
	b.mu.Lock()
	if !b.set {
		b.left, b.set = limit, true
	}
	b.mu.Unlock()
	return b
}

// remaining returns the time left, 0 when it is spent.
func (b *shadowBudget) remaining() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return max(b.left, 0)
}

func (b *shadowBudget) charge(d time.Duration) {
	b.mu.Lock()
	b.left -= d
	b.mu.Unlock()
}

// loadShadows loads the shadows of module of for one chain step of chain c
// (whose config is stepConf): a shadow that fails its checks is kept,
// without an instance, to be shown and counted; it never refuses the
// policy.
func (e *Evaluator) loadShadows(ctx context.Context, next *loaded, c config.Chain, of string, stepConf map[string]any, wasm map[string][]byte) []shadowStep {
	var out []shadowStep
	for _, m := range next.cfg.Modules {
		if m.ShadowOf != of {
			continue
		}
		sh := shadowStep{module: m.Name, of: of, skipped: new(atomic.Uint64),
			compared: e.metrics.shadowCompared.WithLabelValues(m.Name),
			diffs:    e.metrics.shadowDiffs.WithLabelValues(m.Name)}
		inst, err := e.loadShadow(ctx, next.host, c, m, stepConf, wasm)
		if err != nil {
			sh.loadErr = err.Error()
			e.metrics.shadowFailures.WithLabelValues(m.Name, ShadowLoad).Inc()
			e.log.Warn("policy: shadow module refused; the chain runs without it", "chain", c.Name, "module", m.Name, "of", of, "err", err)
			e.shadows.mu.Lock()
			st := e.shadows.stat(m.Name)
			st.failures[ShadowLoad]++
			st.last = sh.loadErr
			e.shadows.mu.Unlock()
		} else {
			sh.inst = inst
			e.log.Info("policy: shadow module checked", "chain", c.Name, "module", m.Name, "of", of, "sha256", inst.SHA256())
		}
		out = append(out, sh)
	}
	return out
}

func (e *Evaluator) loadShadow(ctx context.Context, h *policy.Host, c config.Chain, m config.Module, stepConf map[string]any, wasm map[string][]byte) (*policy.Instance, error) {
	b, ok := wasm[m.Name]
	if !ok {
		var err error
		if b, err = readModule(m.Path, int64(h.Options().MaxModuleSize)); err != nil {
			return nil, fmt.Errorf("chain %s: shadow %s: %w", c.Name, m.Name, err)
		}
		wasm[m.Name] = b
	}
	cfg := m.Config
	if cfg == nil {
		cfg = stepConf
	}
	conf, err := stepConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("chain %s: shadow %s: %w", c.Name, m.Name, err)
	}
	inst, _, err := h.Load(ctx, policy.Spec{Name: m.Name, Wasm: b, SHA256: m.SHA256, Config: conf, AllowEmpty: c.AllowEmpty})
	if err != nil {
		return nil, fmt.Errorf("chain %s: shadow: %w", c.Name, err)
	}
	return inst, nil
}

// runShadows runs the shadows of step st on ins, the inputs st answered
// with active (one per live job), and adds each one's answer to the
// verdicts in out. It changes nothing else of the verdicts.
func (e *Evaluator) runShadows(ctx context.Context, l *loaded, ch *chain, st *step, ins []*abi.Input, live []*job, active []policy.BatchResult, out []Verdict, b *shadowBudget) {
	for i := range st.shadows {
		sh := &st.shadows[i]
		if sh.inst == nil {
			continue // refused at load, counted then
		}
		left := b.remaining()
		if left <= 0 {
			e.shadowSkipped(l, ch, sh, live, out, len(ins), "the sync's shadow budget is spent")
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, left)
		start := time.Now()
		res := sh.inst.EvaluateBatch(sctx, ins)
		cancel()
		b.charge(time.Since(start))
		for n, r := range res {
			s := e.compareShadow(l, ch, sh, ins[n], live[n], active[n], r)
			out[live[n].k].Shadows = append(out[live[n].k].Shadows, s)
		}
	}
}

func (e *Evaluator) shadowSkipped(l *loaded, ch *chain, sh *shadowStep, live []*job, out []Verdict, n int, why string) {
	e.budgetSpent(l, ch, sh, n)
	e.metrics.shadowFailures.WithLabelValues(sh.module, ShadowSkipped).Add(float64(n))
	e.shadows.mu.Lock()
	st := e.shadows.stat(sh.module)
	st.failures[ShadowSkipped] += uint64(n)
	st.last = why
	e.shadows.mu.Unlock()
	for _, jb := range live {
		out[jb.k].Shadows = append(out[jb.k].Shadows, Shadow{Module: sh.module, Of: sh.of, Failure: ShadowSkipped, Error: why})
	}
	e.log.Debug("policy: shadow skipped", "module", sh.module, "ports", n, "why", why)
}

// budgetSpent counts n evaluations of sh skipped for want of shadow
// budget and says so in the log once per loaded generation: a budget too
// small to run any shadow (shadowBudget: 1ns) is otherwise silent but
// for a metric.
func (e *Evaluator) budgetSpent(l *loaded, ch *chain, sh *shadowStep, n int) {
	sh.skipped.Add(uint64(n))
	if l.budgetWarned.CompareAndSwap(false, true) {
		e.log.Warn("policy: shadow evaluations skipped: the sync's shadow budget is spent (logged once until the policy reloads; counted in edgeproxy_policy_shadow_failures_total{reason=\"skipped\"})",
			"budget", l.budget(), "chain", ch.cfg.Name, "module", sh.module, "of", sh.of)
	}
}

// compareShadow checks one shadow answer against the active step's and
// counts and records a difference.
func (e *Evaluator) compareShadow(l *loaded, ch *chain, sh *shadowStep, in *abi.Input, jb *job, a, r policy.BatchResult) Shadow {
	s := Shadow{Module: sh.module, Of: sh.of, Cached: r.Cached}
	if r.Err != nil {
		reason := string(policy.ReasonOf(r.Err))
		switch reason {
		case string(policy.ReasonCanceled):
			reason = ShadowSkipped
			e.budgetSpent(l, ch, sh, 1)
		case "":
			reason = string(policy.ReasonTrap)
		}
		s.Failure, s.Error = reason, r.Err.Error()
		e.metrics.shadowFailures.WithLabelValues(sh.module, reason).Inc()
		e.shadows.mu.Lock()
		st := e.shadows.stat(sh.module)
		st.failures[reason]++
		st.last = s.Error
		e.shadows.mu.Unlock()
		return s
	}
	s.Weights = make([]uint32, len(jb.weights))
	for i, ei := range jb.idx {
		s.Weights[ei] = r.Output.Weights[i]
	}
	s.Scheduler, s.Reason = r.Output.Scheduler, r.Output.Reason
	diff := differ(in, a, r.Output)
	fresh := !(a.Cached && r.Cached) // a repeated input is compared once
	if fresh {
		sh.compared.Inc()
	}
	e.shadows.mu.Lock()
	defer e.shadows.mu.Unlock()
	st := e.shadows.stat(sh.module)
	if fresh {
		st.compared++
	}
	if diff == "" {
		return s
	}
	enc := abi.AppendInput(nil, in)
	sum := sha256.Sum256(enc)
	s.Diff, s.InputSHA256 = diff, hex.EncodeToString(sum[:])
	if !fresh {
		return s
	}
	sh.diffs.Inc()
	st.diffs++
	d := ShadowDiff{
		Time: l.opts.now(), Chain: ch.cfg.Name, Module: sh.module, Of: sh.of, InputSHA256: s.InputSHA256,
		Service: jb.spn,
		Active:  outputOf(a), Shadow: outputOf(r), Reason: diff,
	}
	d.Endpoints = make([]string, len(in.Endpoints))
	for i, ep := range in.Endpoints {
		d.Endpoints[i] = epString(&ep)
	}
	e.shadows.add(d)
	e.log.Debug("policy: shadow differs", "service", d.Service, "module", sh.module, "of", sh.of, "diff", diff)
	return s
}

func epString(ep *abi.Endpoint) string {
	return netip.AddrPortFrom(ep.Addr, ep.Port).String()
}

func outputOf(r policy.BatchResult) ShadowOutput {
	if r.Err != nil {
		reason := string(policy.ReasonOf(r.Err))
		return ShadowOutput{Failure: reason, Error: r.Err.Error()}
	}
	return ShadowOutput{Weights: slices.Clone(r.Output.Weights), Scheduler: r.Output.Scheduler,
		SchedulerFlags: slices.Clone(r.Output.SchedulerFlags), Reason: r.Output.Reason}
}

// differ says how the shadow's output s differs from the active step's
// answer a on input in: weights per endpoint, scheduler and its flags (the
// modules' own reason texts are not compared). Empty when they agree.
func differ(in *abi.Input, a policy.BatchResult, s abi.Output) string {
	if a.Err != nil {
		if policy.ReasonOf(a.Err) == policy.ReasonCanceled {
			return "" // the sync was cancelled: nothing to compare
		}
		return fmt.Sprintf("the active module failed (%s), the shadow answered", policy.ReasonOf(a.Err))
	}
	var parts []string
	n, shown := 0, []string(nil)
	for i, w := range a.Output.Weights {
		if w == s.Weights[i] {
			continue
		}
		n++
		if len(shown) < 4 {
			shown = append(shown, fmt.Sprintf("%s %d->%d", epString(&in.Endpoints[i]), w, s.Weights[i]))
		}
	}
	if n > 0 {
		more := ""
		if n > len(shown) {
			more = ", ..."
		}
		parts = append(parts, fmt.Sprintf("weights differ at %d of %d endpoints: %s%s", n, len(a.Output.Weights), strings.Join(shown, ", "), more))
	}
	if a.Output.Scheduler != s.Scheduler || !slices.Equal(a.Output.SchedulerFlags, s.SchedulerFlags) {
		parts = append(parts, fmt.Sprintf("scheduler %s->%s", schedString(a.Output), schedString(s)))
	}
	return strings.Join(parts, "; ")
}

func schedString(o abi.Output) string {
	s := o.Scheduler
	if s == "" {
		s = `""`
	}
	if len(o.SchedulerFlags) > 0 {
		s += "(" + strings.Join(o.SchedulerFlags, ",") + ")"
	}
	return s
}

// ShadowReport returns the shadows loaded, their counts and the latest
// differences; service ("namespace/name"), when not empty, keeps only
// that service's differences.
func (e *Evaluator) ShadowReport(service string) ShadowReport {
	l := e.acquire()
	rep := ShadowReport{Budget: DefaultShadowBudget, Modules: []ShadowStatus{}}
	var shadows []ShadowStatus
	if l != nil {
		rep.Budget = l.budget()
		for _, c := range l.chains {
			for _, st := range c.steps {
				for _, sh := range st.shadows {
					s := ShadowStatus{Chain: c.cfg.Name, Module: sh.module, Of: sh.of, Loaded: sh.inst != nil, LoadErr: sh.loadErr}
					if sh.inst != nil {
						s.SHA256 = sh.inst.SHA256()
					}
					shadows = append(shadows, s)
				}
			}
		}
	}
	l.release()
	e.shadows.mu.Lock()
	defer e.shadows.mu.Unlock()
	for _, s := range shadows {
		st := e.shadows.stat(s.Module)
		s.Compared, s.Differences, s.LastFailure = st.compared, st.diffs, st.last
		if len(st.failures) > 0 {
			s.Failures = make(map[string]uint64, len(st.failures))
			for k, v := range st.failures {
				s.Failures[k] = v
			}
		}
		rep.Modules = append(rep.Modules, s)
	}
	rep.Diffs = []ShadowDiff{}
	for _, d := range e.shadows.diffs() {
		if service == "" || d.Service.Namespace+"/"+d.Service.Name == service {
			rep.Diffs = append(rep.Diffs, d)
		}
	}
	return rep
}

func (l *loaded) budget() time.Duration {
	if l.cfg.ShadowBudget > 0 {
		return l.cfg.ShadowBudget
	}
	return DefaultShadowBudget
}

// shadowCount is for Reload's summary line.
func shadowCount(l *loaded) int {
	n := 0
	for _, c := range l.chains {
		for _, s := range c.steps {
			n += len(s.shadows)
		}
	}
	return n
}
