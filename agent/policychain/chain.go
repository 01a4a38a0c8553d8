// Package chain runs the configured Wasm policy chains for the agent: it
// loads and checks the modules named in config.Policy (through package
// policy), picks the chain that matches a service, converts the agent's
// model into the policy ABI's input and the modules' outputs back into one
// weight per endpoint, applies each chain's failure policy, and records
// metrics and the per-module verdicts for the explain view.
//
// One Evaluator serves the sync loop; Reload swaps in a new module set only
// when every module of it passed its checks.
package policychain

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/policy"
	"github.com/edgeproxy/edgeproxy/policy/abi"
)

// DefaultServiceKeyPrefix is used when WithServiceKeyPrefix is not given.
const DefaultServiceKeyPrefix = "edgeproxy.io/"

// Option adjusts an Evaluator.
type Option func(*options)

type options struct {
	prefix     string
	nodeLabels []string
	now        func() time.Time
}

// WithServiceKeyPrefix sets which service labels and annotations modules
// see: only keys starting with prefix (config.Config.ServiceKeyPrefix). An
// empty prefix passes them all.
func WithServiceKeyPrefix(prefix string) Option { return func(o *options) { o.prefix = prefix } }

// WithNodeLabels sets which node labels modules see (config.Config.NodeLabels).
func WithNodeLabels(keys []string) Option {
	return func(o *options) { o.nodeLabels = slices.Clone(keys) }
}

// WithClock sets the clock of the modules' circuit breakers (tests).
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// Evaluator evaluates service ports through the configured chains. It is
// safe for concurrent use.
type Evaluator struct {
	log      *slog.Logger
	metrics  *metrics
	stateDir string

	// mu guards cur and opts, and is held only to take or swap them: an
	// evaluation holds its generation (loaded.users), not mu, so a reload
	// never waits for one and no evaluation waits for a load.
	mu   sync.RWMutex
	cur  *loaded
	opts options
	// reloading is held from Prepare to Swap.Done: one reload at a time.
	reloading sync.Mutex

	lgMu     sync.Mutex
	lastGood map[lastGoodKey]lastGood

	shadows shadowLog
}

// loaded is one generation of chains: a checked module set and the
// options it was loaded with.
type loaded struct {
	cfg    config.Policy
	opts   options
	host   *policy.Host
	chains []*chain
	// users is held shared by every evaluation and report that uses this
	// generation (Evaluator.acquire); its modules are closed under the
	// exclusive lock, so never while one runs (closing unmaps a guest's
	// memory).
	users sync.RWMutex
	// budgetWarned: a shadow skipped for want of budget was logged.
	budgetWarned atomic.Bool
}

type chain struct {
	cfg   config.Chain
	steps []step
}

type step struct {
	module string
	inst   *policy.Instance
	// The module's series, looked up once: WithLabelValues hashes its
	// labels on every call, and Evaluate runs once per service port.
	calls, cacheHits prometheus.Counter
	duration         prometheus.Observer
	// shadows run after the step on its inputs (config.Module.ShadowOf).
	shadows []shadowStep
}

// lastGoodKey is a chain and a service port: a struct, not a joined
// string, so that recording an answer (once per evaluated port) builds no
// string.
type lastGoodKey struct {
	chain string
	port  model.ServicePortName
}

type lastGood struct {
	addrs     []netip.AddrPort
	weights   []uint32 // by addrs
	scheduler string
	flags     []string
}

// New loads and checks every module of cfg and returns an Evaluator
// running its chains. Compiled code is cached under stateDir/wasm-cache
// (mode 0700). reg may be nil.
func New(ctx context.Context, cfg config.Policy, stateDir string, log *slog.Logger, reg prometheus.Registerer, opts ...Option) (*Evaluator, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("chain: register metrics: %w", err)
	}
	e := &Evaluator{
		log: log.With("component", "policy"), metrics: m, stateDir: stateDir,
		opts: options{prefix: DefaultServiceKeyPrefix, now: time.Now}, lastGood: map[lastGoodKey]lastGood{},
	}
	for _, o := range opts {
		o(&e.opts)
	}
	if err := e.Reload(ctx, cfg); err != nil {
		return nil, err
	}
	return e, nil
}

// Reload loads and checks cfg's modules and, only when all pass, swaps
// them in and closes the old ones once no evaluation uses them. On any
// failure it returns the error (with every failed check) and the previous
// chains keep running. Options given here replace the corresponding ones
// given to New. Evaluations go on, with the previous chains, while the
// modules load: it is Prepare, Swap.Commit and Swap.Done in one.
func (e *Evaluator) Reload(ctx context.Context, cfg config.Policy, opts ...Option) error {
	sw, err := e.Prepare(ctx, cfg, opts...)
	if err != nil {
		return err
	}
	sw.Commit()
	sw.Done(ctx)
	return nil
}

// Swap is a reload whose modules are loaded and checked, to be put in
// force by Commit. Until Done, other reloads wait.
type Swap struct {
	e         *Evaluator
	next, old *loaded
	committed bool
}

// Prepare loads and checks cfg's modules, reading, compiling,
// instantiating and probing each, without touching the chains in force:
// evaluations go on meanwhile. On success it returns the Swap that puts
// them in force; the caller must call its Done. On failure it returns
// the error (with every failed check), counted and logged, and nothing
// changed.
func (e *Evaluator) Prepare(ctx context.Context, cfg config.Policy, opts ...Option) (*Swap, error) {
	e.reloading.Lock()
	e.mu.RLock()
	old, o := e.cur, e.opts
	e.mu.RUnlock()
	for _, opt := range opts {
		opt(&o)
	}
	next, err := e.load(ctx, cfg, old, o)
	if err != nil {
		e.shadows.keepOnly(old) // the counts of shadows that never ran
		e.reloading.Unlock()
		e.metrics.reloads.WithLabelValues("failure").Inc()
		if old == nil {
			// The first load (New): no chains run that could keep running.
			e.log.Error("policy: modules refused", "err", err)
		} else {
			e.log.Error("policy: new modules refused; the previous chains keep running", "err", err)
		}
		return nil, err
	}
	return &Swap{e: e, next: next, old: old}, nil
}

// Commit puts the prepared chains in force: the next evaluation uses
// them. It is a pointer swap, cheap enough to make under the caller's own
// lock (the agent's sync lock, so that no sync sees half of a reload).
func (s *Swap) Commit() {
	e := s.e
	e.mu.Lock()
	e.cur, e.opts = s.next, s.next.opts
	e.mu.Unlock()
	s.committed = true
	// lastGood survives: a new module version that fails at run time
	// falls back to what the previous one answered.
	e.metrics.reloads.WithLabelValues("success").Inc()
	e.shadows.keepOnly(s.next)
	names := make([]string, len(s.next.chains))
	for i, c := range s.next.chains {
		names[i] = c.cfg.Name
	}
	e.log.Info("policy: chains loaded", "engine", s.next.host.Engine(), "modules", len(s.next.cfg.Modules), "chains", names, "shadows", shadowCount(s.next))
}

// Done ends the reload: after Commit it closes the previous chains, once
// no evaluation uses them any more (it waits for those running); without
// Commit it closes the prepared ones. Call it outside any lock an
// evaluation may need.
func (s *Swap) Done(ctx context.Context) {
	defer s.e.reloading.Unlock()
	if !s.committed {
		var shared *policy.Host
		if s.old != nil {
			shared = s.old.host
		}
		s.next.close(ctx, shared)
		return
	}
	if s.old != nil {
		s.old.users.Lock()
		defer s.old.users.Unlock()
		s.old.close(ctx, s.next.host)
	}
}

// acquire returns the generation in force, held for use until its
// release; nil when there is none.
func (e *Evaluator) acquire() *loaded {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.cur != nil {
		e.cur.users.RLock()
	}
	return e.cur
}

func (l *loaded) release() {
	if l != nil {
		l.users.RUnlock()
	}
}

func hostOptions(cfg config.Policy, stateDir string, log *slog.Logger, o options) policy.Options {
	ho := policy.Options{
		Engine: cfg.Engine, Timeout: cfg.Timeout, MemoryLimit: int64(cfg.MemoryLimit),
		MaxModuleSize: int64(cfg.MaxModuleSize), Log: log, Now: o.now,
	}
	// Without modules there is nothing to compile: no cache directory is
	// needed, so `plan` runs as any user without a writable stateDir.
	if stateDir != "" && len(cfg.Modules) > 0 {
		ho.CacheDir = filepath.Join(stateDir, "wasm-cache")
	}
	return ho
}

func sameHost(a, b policy.Options) bool {
	return a.Engine == b.Engine && a.Timeout == b.Timeout && a.MemoryLimit == b.MemoryLimit &&
		a.MaxModuleSize == b.MaxModuleSize && a.CacheDir == b.CacheDir && a.Breaker == b.Breaker
}

func (e *Evaluator) load(ctx context.Context, cfg config.Policy, old *loaded, o options) (_ *loaded, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("chain: invalid policy config: %w", err)
	}
	want := hostOptions(cfg, e.stateDir, e.log, o)
	next := &loaded{cfg: cfg, opts: o}
	if old != nil && sameHost(want.WithDefaults(), old.host.Options()) {
		next.host = old.host
	}
	if next.host == nil {
		if next.host, err = policy.NewHost(ctx, want); err != nil {
			return nil, fmt.Errorf("chain: %w", err)
		}
	}
	defer func() {
		if err != nil {
			var sharedHost *policy.Host
			if old != nil {
				sharedHost = old.host
			}
			next.close(ctx, sharedHost)
		}
	}()
	files := map[string]config.Module{}
	for _, m := range cfg.Modules {
		files[m.Name] = m
	}
	wasm := map[string][]byte{}
	var errs []error
	for _, c := range cfg.Chains {
		ch := &chain{cfg: c}
		next.chains = append(next.chains, ch)
		for _, s := range c.Modules {
			m := files[s.Module]
			b, ok := wasm[m.Name]
			if !ok {
				if b, err = readModule(m.Path, int64(next.host.Options().MaxModuleSize)); err != nil {
					errs = append(errs, fmt.Errorf("chain %s: module %s: %w", c.Name, m.Name, err))
					continue
				}
				wasm[m.Name] = b
			}
			conf, err := stepConfig(s.Config)
			if err != nil {
				errs = append(errs, fmt.Errorf("chain %s: module %s: %w", c.Name, m.Name, err))
				continue
			}
			inst, rep, err := next.host.Load(ctx, policy.Spec{Name: m.Name, Wasm: b, SHA256: m.SHA256, Config: conf, AllowEmpty: c.AllowEmpty})
			if err != nil {
				errs = append(errs, fmt.Errorf("chain %s: %w", c.Name, err))
				continue
			}
			e.log.Info("policy: module checked", "chain", c.Name, "module", m.Name, "sha256", rep.SHA256, "engine", rep.Engine)
			ch.steps = append(ch.steps, step{module: m.Name, inst: inst,
				calls:     e.metrics.calls.WithLabelValues(m.Name),
				cacheHits: e.metrics.cacheHits.WithLabelValues(m.Name),
				duration:  e.metrics.duration.WithLabelValues(m.Name),
				shadows:   e.loadShadows(ctx, next, c, m.Name, s.Config, wasm)})
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("chain: load policy: %w", err)
	}
	return next, nil
}

func (l *loaded) close(ctx context.Context, keepHost *policy.Host) {
	for _, c := range l.chains {
		for _, s := range c.steps {
			s.inst.Close(ctx)
			for _, sh := range s.shadows {
				if sh.inst != nil {
					sh.inst.Close(ctx)
				}
			}
		}
	}
	if l.host != nil && l.host != keepHost {
		l.host.Close(ctx)
	}
}

// readModule reads the module file at path, at most limit bytes. Only a
// regular file is read, as the open file says (a prior stat could be
// raced by a rename): a FIFO, a device such as /dev/zero or a socket is
// refused. The open does not wait for a FIFO's writer (O_NONBLOCK, which
// a regular file's reads ignore), and the read stops at limit+1 bytes
// even if the file grows meanwhile.
func readModule(path string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%s); a module must be a .wasm file", path, fileKind(st.Mode()))
	}
	tooBig := func(n int64) error {
		return fmt.Errorf("%s: larger than policy.maxModuleSize (%d bytes, limit %d)", path, n, limit)
	}
	if st.Size() > limit {
		return nil, tooBig(st.Size())
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, tooBig(int64(len(b)))
	}
	return b, nil
}

// fileKind names the type of a file that is not a regular one.
func fileKind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	}
	return "mode " + m.Type().String()
}

func stepConfig(c map[string]any) ([]byte, error) {
	if c == nil {
		return []byte("{}"), nil
	}
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("config to JSON: %w", err)
	}
	return b, nil
}

// Close releases every module, once the evaluations running end; it
// waits for a reload in progress.
func (e *Evaluator) Close(ctx context.Context) error {
	e.reloading.Lock()
	defer e.reloading.Unlock()
	e.mu.Lock()
	l := e.cur
	e.cur = nil
	e.mu.Unlock()
	if l != nil {
		l.users.Lock()
		defer l.users.Unlock()
		l.close(ctx, nil)
	}
	return nil
}

// Engine returns the Wasm engine in use.
func (e *Evaluator) Engine() string {
	l := e.acquire()
	defer l.release()
	if l == nil {
		return ""
	}
	return l.host.Engine()
}

// ModuleStatus describes one loaded chain step or shadow, for status
// output.
type ModuleStatus struct {
	Chain, Module, SHA256 string
	State                 policy.State
	// ShadowOf is set on a shadow: the module it shadows.
	ShadowOf string `json:",omitempty"`
	// Skipped counts a shadow's evaluations skipped since the chains were
	// loaded because the sync's shadow budget (policy.shadowBudget) was
	// spent.
	Skipped uint64 `json:",omitempty"`
}

// Modules lists every loaded chain step, each followed by its shadows.
func (e *Evaluator) Modules() []ModuleStatus {
	l := e.acquire()
	defer l.release()
	var out []ModuleStatus
	if l == nil {
		return nil
	}
	for _, c := range l.chains {
		for _, s := range c.steps {
			out = append(out, ModuleStatus{Chain: c.cfg.Name, Module: s.module, SHA256: s.inst.SHA256(), State: s.inst.State()})
			for _, sh := range s.shadows {
				if sh.inst != nil {
					out = append(out, ModuleStatus{Chain: c.cfg.Name, Module: sh.module, SHA256: sh.inst.SHA256(), State: sh.inst.State(),
						ShadowOf: sh.of, Skipped: sh.skipped.Load()})
				}
			}
		}
	}
	return out
}

// CheckFile runs every check on the module file at path, the way a chain
// would load it, for `edgeproxy module check FILE`. When path is the path
// of a configured module its name and sha256 pin are used. The report
// lists every check; the error is non-nil when the module is refused or
// could not be read.
func CheckFile(ctx context.Context, cfg config.Policy, path string, log *slog.Logger) (*policy.Report, error) {
	b, err := readModule(path, int64(cmp.Or(cfg.MaxModuleSize, 64<<20)))
	if err != nil {
		return nil, fmt.Errorf("chain: check: %w", err) // err names the path
	}
	spec := policy.Spec{Name: filepath.Base(path), Wasm: b}
	abs, _ := filepath.Abs(path)
	for _, m := range cfg.Modules {
		if ma, _ := filepath.Abs(m.Path); ma == abs {
			spec.Name, spec.SHA256 = m.Name, m.SHA256
		}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h, err := policy.NewHost(ctx, hostOptions(cfg, "", log, options{}))
	if err != nil {
		return nil, fmt.Errorf("chain: check %s: %w", path, err)
	}
	defer h.Close(ctx)
	r := h.Check(ctx, spec)
	return r, r.Err()
}

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
		HintZones: e.HintZones, HintNodes: e.HintNodes, Weight: w,
	}
}
