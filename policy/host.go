// Package policy is the wazero host for policy modules: it checks a module
// before it is trusted, instantiates it in an empty sandbox with a memory
// cap, calls it with a deadline, validates every output, and contains
// failures (discard the instance, re-create it with backoff, open a circuit
// after repeated failures). It knows nothing of Kubernetes; the agent
// converts its model into abi.Input (see agent/policychain).
package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/edgeproxy/edgeproxy/policy/abi"
)

// Engines.
const (
	Compiler    = "compiler"
	Interpreter = "interpreter"
)

// Options configure a Host. Zero values take the defaults shown.
type Options struct {
	// Engine is Compiler (default) or Interpreter. The interpreter writes
	// no executable memory, so it works under systemd's
	// MemoryDenyWriteExecute=yes.
	Engine string
	// CacheDir holds the compiled-code cache (compiler engine only),
	// keyed by the module's sha256; created with mode 0700. Empty: in
	// memory only.
	CacheDir string
	// MemoryLimit caps each instance's linear memory (default 16 MiB,
	// rounded down to 64 KiB pages).
	MemoryLimit int64
	// Timeout is the deadline of one evaluation, input copy included
	// (default 5ms). Instantiation and init get InitTimeout (default
	// 100×Timeout, at least 1s); check-time probes ProbeTimeout (default
	// 10×Timeout, at least 100ms).
	Timeout, InitTimeout, ProbeTimeout time.Duration
	// BatchSize and BatchBytes bound one ep_evaluate_batch call (ABI 1.1):
	// at most BatchSize inputs (default 64) of at most BatchBytes encoded
	// bytes together (default 256 KiB); both are capped at the ABI's
	// limits. A batch's deadline is Timeout per input in it.
	BatchSize  int
	BatchBytes int
	// MaxModuleSize refuses bigger files (default 8 MiB).
	MaxModuleSize int64
	// CacheEntries bounds the per-instance result cache (default 16384: a
	// resync of up to 8192 service ports through one chain step is answered
	// from the cache entirely).
	CacheEntries int
	// Breaker tunes failure containment.
	Breaker Breaker
	Log     *slog.Logger
	// Now is the clock for backoff and the circuit breaker (default
	// time.Now); tests step it.
	Now func() time.Time
}

// Breaker tunes how failing modules are contained. After a trap or timeout
// the instance is discarded; it is re-created at the next call after a
// first failure, and after a further consecutive failure no sooner than
// RetryBase, doubling up to RetryMax. After Threshold
// consecutive failures of any kind the circuit opens for OpenFor (doubling
// up to OpenMax while it keeps failing); one call is let through when it
// ends, and a success closes it.
type Breaker struct {
	Threshold           int
	RetryBase, RetryMax time.Duration
	OpenFor, OpenMax    time.Duration
}

// WithDefaults returns o with every zero value replaced by its default.
func (o Options) WithDefaults() Options {
	o.defaults()
	return o
}

func (o *Options) defaults() {
	if o.Engine == "" {
		o.Engine = Compiler
	}
	if o.MemoryLimit <= 0 {
		o.MemoryLimit = 16 << 20
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Millisecond
	}
	if o.InitTimeout <= 0 {
		o.InitTimeout = max(100*o.Timeout, time.Second)
	}
	if o.ProbeTimeout <= 0 {
		o.ProbeTimeout = max(10*o.Timeout, 100*time.Millisecond)
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 64
	}
	o.BatchSize = min(o.BatchSize, abi.MaxBatchCount)
	if o.BatchBytes <= 0 {
		o.BatchBytes = 256 << 10
	}
	o.BatchBytes = min(o.BatchBytes, abi.MaxBatchBytes-8-4*o.BatchSize)
	if o.MaxModuleSize <= 0 {
		o.MaxModuleSize = 8 << 20
	}
	if o.CacheEntries <= 0 {
		o.CacheEntries = 16384
	}
	b := &o.Breaker
	if b.Threshold <= 0 {
		b.Threshold = 5
	}
	if b.RetryBase <= 0 {
		b.RetryBase = 50 * time.Millisecond
	}
	if b.RetryMax <= 0 {
		b.RetryMax = 5 * time.Second
	}
	if b.OpenFor <= 0 {
		b.OpenFor = 10 * time.Second
	}
	if b.OpenMax <= 0 {
		b.OpenMax = 5 * time.Minute
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Host owns one wazero runtime. It is safe for concurrent use; each
// Instance serializes its own calls.
//
// A module runs in one of two runtimes. With the compiler engine it is
// first rewritten (instrument) to check an interrupt global at every loop
// header, which a timer per instance sets at the deadline, and runs in rt,
// which wazero does not instrument. The interpreter, and a module the
// rewriter does not understand, run in checked, which has wazero's own
// WithCloseOnContextDone: a call into Go at every loop header and a
// goroutine per call (RATIONALE.md, "What a guest call costs").
type Host struct {
	opts    Options
	engine  string
	rt      wazero.Runtime // compiler engine, no wazero deadline checks; nil with the interpreter
	checked wazero.Runtime // WithCloseOnContextDone; created when first needed
	cfg     wazero.RuntimeConfig
	cache   wazero.CompilationCache

	mu       sync.Mutex
	compiled map[string]*compiledModule // by sha256
}

// compiledModule is compiled code shared by every instance of one module
// file: compiling again would duplicate megabytes of metadata per instance.
type compiledModule struct {
	cm wazero.CompiledModule
	rt wazero.Runtime // the runtime it was compiled for
	// interruptible: the code checks the interrupt global (instrument);
	// otherwise wazero's context checks stop it.
	interruptible bool
	refs          int
}

// compile returns the compiled module for wasm (whose hex sha256 is sum),
// compiling it only if no instance holds it. Pair with release.
func (h *Host) compile(ctx context.Context, sum string, wasm []byte) (*compiledModule, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c, ok := h.compiled[sum]; ok {
		c.refs++
		return c, nil
	}
	c := &compiledModule{refs: 1}
	if h.rt != nil {
		rewritten, cached, err := h.rewrite(sum, wasm)
		if err == nil {
			cm, cerr := h.rt.CompileModule(ctx, rewritten)
			if cerr != nil && cached != "" { // a damaged cache file: rewrite again
				_ = os.Remove(cached)
				if rewritten, cerr = instrument(wasm); cerr == nil {
					cm, cerr = h.rt.CompileModule(ctx, rewritten)
				}
			}
			if cerr == nil {
				c.cm, c.rt, c.interruptible = cm, h.rt, true
			}
			err = cerr
		}
		if err != nil {
			h.opts.Log.Info("policy: module not rewritten for the interrupt check; wazero's slower deadline checks apply", "sha256", sum, "err", err)
		}
	}
	if c.cm == nil {
		if h.checked == nil {
			rt, err := h.newRuntime(ctx, h.cfg.WithCloseOnContextDone(true))
			if err != nil {
				return nil, err
			}
			h.checked = rt
		}
		c.rt = h.checked
		var err error
		if c.cm, err = c.rt.CompileModule(ctx, wasm); err != nil {
			return nil, err
		}
	}
	if h.compiled == nil {
		h.compiled = map[string]*compiledModule{}
	}
	h.compiled[sum] = c
	return c, nil
}

// rewriteVersion names the cached rewrites of this instrument: bump it
// when instrument's output changes.
const rewriteVersion = "interrupt-v2-"

// rewrite returns instrument(wasm) (whose hex sha256 is sum). With a
// CacheDir it keeps the result there, next to wazero's compiled code and
// trusted as much: a restart then reads the file instead of rewriting
// ~8 ms of a Go module's load. cached is the file read, if any.
func (h *Host) rewrite(sum string, wasm []byte) (out []byte, cached string, err error) {
	if h.opts.CacheDir == "" {
		out, err = instrument(wasm)
		return out, "", err
	}
	path := filepath.Join(h.opts.CacheDir, rewriteVersion+sum+".wasm")
	if out, err := os.ReadFile(path); err == nil {
		return out, path, nil
	}
	if out, err = instrument(wasm); err != nil {
		return nil, "", err
	}
	if err := writeAtomic(path, out); err != nil {
		h.opts.Log.Debug("policy: rewritten module not cached", "err", err)
	}
	return out, "", nil
}

// writeAtomic writes b to path through a temporary file in the same
// directory and a rename, so that a reader never sees part of it.
func writeAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("policy: cache %s: %w", path, err)
	}
	return nil
}

// release drops one reference taken by compile and frees the code with
// the last one.
func (h *Host) release(ctx context.Context, sum string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	c, ok := h.compiled[sum]
	if !ok {
		return nil
	}
	if c.refs--; c.refs > 0 {
		return nil
	}
	delete(h.compiled, sum)
	return c.cm.Close(ctx)
}

// NewHost creates the runtime, with WASI preview 1 and the host's log
// function available to modules. With the compiler engine it first
// compiles and runs a tiny module; if that fails (no executable memory, an
// unsupported platform) it logs why and falls back to the interpreter.
func NewHost(ctx context.Context, opts Options) (*Host, error) {
	opts.defaults()
	h := &Host{opts: opts}
	switch opts.Engine {
	case Compiler:
		if err := compilerSelfTest(ctx); err != nil {
			opts.Log.Warn("policy: compiler engine failed its self-test; using the interpreter", "err", err)
			h.engine = Interpreter
		} else {
			h.engine = Compiler
		}
	case Interpreter:
		h.engine = Interpreter
	default:
		return nil, fmt.Errorf("policy: unknown engine %q (want %s or %s)", opts.Engine, Compiler, Interpreter)
	}
	var err error
	if h.engine == Compiler && opts.CacheDir != "" {
		if err := os.MkdirAll(opts.CacheDir, 0o700); err != nil {
			if why := DirProblem(opts.CacheDir); why != nil {
				err = why
			}
			return nil, fmt.Errorf("policy: compilation cache %s (under stateDir): %w", opts.CacheDir, err)
		}
		if err := os.Chmod(opts.CacheDir, 0o700); err != nil {
			return nil, fmt.Errorf("policy: compilation cache: %w", err)
		}
		if h.cache, err = wazero.NewCompilationCacheWithDir(opts.CacheDir); err != nil {
			return nil, fmt.Errorf("policy: compilation cache %s: %w", opts.CacheDir, err)
		}
	} else {
		h.cache = wazero.NewCompilationCache()
	}
	var cfg wazero.RuntimeConfig
	if h.engine == Compiler {
		cfg = wazero.NewRuntimeConfigCompiler()
	} else {
		cfg = wazero.NewRuntimeConfigInterpreter()
	}
	pages := uint32(opts.MemoryLimit / 65536)
	if pages == 0 {
		pages = 1
	}
	h.cfg = cfg.WithMemoryLimitPages(pages).WithCompilationCache(h.cache)
	if h.engine == Compiler {
		h.rt, err = h.newRuntime(ctx, h.cfg)
	} else {
		h.checked, err = h.newRuntime(ctx, h.cfg.WithCloseOnContextDone(true))
	}
	if err != nil {
		h.Close(ctx)
		return nil, err
	}
	return h, nil
}

// newRuntime creates a runtime with WASI preview 1 and the host module.
func (h *Host) newRuntime(ctx context.Context, cfg wazero.RuntimeConfig) (wazero.Runtime, error) {
	rt := wazero.NewRuntimeWithConfig(ctx, cfg)
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, rt); err != nil {
		rt.Close(ctx)
		return nil, fmt.Errorf("policy: instantiate WASI: %w", err)
	}
	_, err := rt.NewHostModuleBuilder(abi.HostModule).
		NewFunctionBuilder().WithFunc(hostLog).Export(abi.LogImport).
		Instantiate(ctx)
	if err != nil {
		rt.Close(ctx)
		return nil, fmt.Errorf("policy: instantiate host module: %w", err)
	}
	return rt, nil
}

// Engine returns the engine in use (which may be the interpreter although
// the compiler was asked for; see NewHost).
func (h *Host) Engine() string { return h.engine }

// Options returns the effective options.
func (h *Host) Options() Options { return h.opts }

// Close releases the runtime and every instance created by it.
func (h *Host) Close(ctx context.Context) error {
	var errs []error
	for _, rt := range []wazero.Runtime{h.rt, h.checked} {
		if rt != nil {
			errs = append(errs, rt.Close(ctx))
		}
	}
	if h.cache != nil {
		errs = append(errs, h.cache.Close(ctx))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("policy: close host: %w", err)
	}
	return nil
}

// selfTestWasm is a module exporting add(i32, i32) -> i32.
var selfTestWasm = []byte{
	0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
	0x01, 0x07, 0x01, 0x60, 0x02, 0x7f, 0x7f, 0x01, 0x7f, // type (i32 i32) -> i32
	0x03, 0x02, 0x01, 0x00, // one function of type 0
	0x07, 0x07, 0x01, 0x03, 'a', 'd', 'd', 0x00, 0x00, // export "add"
	0x0a, 0x09, 0x01, 0x07, 0x00, 0x20, 0x00, 0x20, 0x01, 0x6a, 0x0b, // local.get 0 1, i32.add
}

func compilerSelfTest(ctx context.Context) (err error) {
	switch runtime.GOARCH {
	case "amd64", "arm64":
	default:
		return fmt.Errorf("no compiler for %s", runtime.GOARCH)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("compiler panicked: %v", r)
		}
	}()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigCompiler())
	defer rt.Close(ctx)
	m, err := rt.Instantiate(ctx, selfTestWasm)
	if err != nil {
		return err
	}
	res, err := m.ExportedFunction("add").Call(ctx, 2, 3)
	if err != nil {
		return err
	}
	if len(res) != 1 || api.DecodeI32(res[0]) != 5 {
		return fmt.Errorf("add(2, 3) = %v", res)
	}
	return nil
}

// callKey carries the calling Instance to hostLog.
type callKey struct{}

const (
	maxLogLine     = 512
	maxLogsPerCall = 8
)

// hostLog implements edgeproxy.log: copy at most maxLogLine bytes of guest
// memory and log them with the module's name, at most maxLogsPerCall times
// per evaluation (a batch call makes several).
func hostLog(ctx context.Context, m api.Module, level, ptr, n uint32) {
	inst, _ := ctx.Value(callKey{}).(*Instance)
	if inst == nil {
		return
	}
	inst.logs++
	if inst.logs > inst.logLimit {
		return
	}
	n = min(n, maxLogLine)
	view, ok := m.Memory().Read(ptr, n)
	if !ok {
		return
	}
	msg := strings.ToValidUTF8(string(view), "?")
	lv := slog.LevelDebug
	switch level {
	case abi.LevelInfo:
		lv = slog.LevelInfo
	case abi.LevelWarn:
		lv = slog.LevelWarn
	case abi.LevelError:
		lv = slog.LevelWarn // a module's own error is not the proxy's
	}
	inst.lastLog = msg
	inst.log.Log(ctx, lv, "module says", "msg", msg)
}
