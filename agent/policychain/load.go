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
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/policy"
)

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
