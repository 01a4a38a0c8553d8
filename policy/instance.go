package policy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/sys"

	"github.com/edgeproxy/edgeproxy/policy/abi"
)

// Instance is one checked module with its config, ready to evaluate. It
// owns at most one wazero instance at a time, re-creating it after a trap
// or timeout. Calls are serialized.
type Instance struct {
	h        *Host
	spec     Spec
	sha      string
	compiled *compiledModule
	log      *slog.Logger
	// callCtx is the context of every call of an interruptible module:
	// wazero does not look at it (its deadline is the watchdog's), so one
	// value serves all calls and none allocates.
	callCtx context.Context

	mu          sync.Mutex
	mod         api.Module // nil while discarded
	mem         api.Memory
	alloc, eval api.Function
	batch       api.Function    // nil when the module does not export it
	watch       *watchdog       // nil unless compiled.interruptible
	deadline    context.Context // of the current call, without a watchdog
	cancel      context.CancelFunc
	stack       [2]uint64
	stderr      tailBuffer
	logs        int    // log lines in the current call
	logLimit    int    // log lines kept in the current call
	lastLog     string // the latest line the module logged

	failures  int // consecutive
	retryAt   time.Time
	openUntil time.Time
	openFor   time.Duration

	cache resultCache
	buf   []byte
	// out holds the copy of the module's last output; decoding copies
	// what it keeps, so it is reused.
	out []byte
	// inPtr/inCap: the guest buffer from the last ep_alloc, reused while
	// inputs fit (ABI.md: valid until the next ep_alloc).
	inPtr, inCap uint32
	// For EvaluateBatch: the encoded inputs back to back, the inputs
	// still to evaluate, a batch's framing, and its output items.
	encoded []byte
	todo    []pending
	frame   []byte
	items   [][]byte
}

// Result is a successful evaluation.
type Result struct {
	// Output is valid for the input it answers (see abi.Output.Validate)
	// and owned by the caller.
	Output abi.Output
	// Cached is set when the output came from the result cache.
	Cached bool
	// Duration is the time spent on the call, copies included (0 when
	// cached).
	Duration time.Duration
}

// State is a snapshot of an instance's containment state.
type State struct {
	Instantiated bool
	Failures     int       // consecutive failures
	OpenUntil    time.Time // zero unless the circuit is or was open
	MemoryBytes  uint32    // linear memory of the current wasm instance
}

func (h *Host) newInstance(spec Spec, cm *compiledModule) *Instance {
	if spec.Config == nil {
		spec.Config = []byte("{}")
	}
	sum := sha256.Sum256(spec.Wasm)
	spec.Wasm = nil // compiled; do not keep the bytes
	i := &Instance{
		h: h, spec: spec, sha: hex.EncodeToString(sum[:]), compiled: cm,
		log:   h.opts.Log.With("module", spec.Name),
		cache: resultCache{max: h.opts.CacheEntries},
	}
	i.callCtx = context.WithValue(context.Background(), callKey{}, i)
	return i
}

// Name returns the module's name.
func (i *Instance) Name() string { return i.spec.Name }

// SHA256 returns the hex sha256 of the module file.
func (i *Instance) SHA256() string { return i.sha }

// State returns the containment state.
func (i *Instance) State() State {
	i.mu.Lock()
	defer i.mu.Unlock()
	s := State{Instantiated: i.mod != nil, Failures: i.failures, OpenUntil: i.openUntil}
	if i.mem != nil && i.mod != nil {
		s.MemoryBytes = i.mem.Size()
	}
	return s
}

// Close releases the instance and its share of the compiled code.
func (i *Instance) Close(ctx context.Context) error {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.discard(ctx)
	if i.compiled != nil {
		i.compiled = nil
		if err := i.h.release(ctx, i.sha); err != nil {
			return fmt.Errorf("policy: close module %s: %w", i.spec.Name, err)
		}
	}
	return nil
}

func (i *Instance) discard(ctx context.Context) {
	if i.mod != nil {
		_ = i.mod.Close(ctx) // may already be closed by a deadline
	}
	i.mod, i.mem, i.alloc, i.eval, i.batch, i.watch = nil, nil, nil, nil, nil, nil
	i.inPtr, i.inCap = 0, 0
}

// instantiate creates the wasm instance in an empty sandbox (no files,
// environment, arguments or real clock; start functions off), runs the
// reactor initializer and hands the module its config.
func (i *Instance) instantiate(ctx context.Context, warm bool) error {
	if i.compiled == nil {
		return errors.New("instance closed")
	}
	i.discard(ctx)
	i.stderr.reset()
	cfg := wazero.NewModuleConfig().WithName("").WithStartFunctions().
		WithStdout(&i.stderr).WithStderr(&i.stderr)
	i.logs, i.logLimit = 0, maxLogsPerCall
	actx := experimental.WithMemoryAllocator(context.WithValue(ctx, callKey{}, i), memoryAllocator)
	mod, err := i.compiled.rt.InstantiateModule(actx, i.compiled.cm, cfg) // runs no guest code
	if err != nil {
		return fmt.Errorf("instantiate: %w", shortErr{firstLine(err.Error()) + i.stderr.suffix(), err})
	}
	i.mod, i.mem = mod, mod.ExportedMemory(abi.MemoryExport)
	i.alloc, i.eval = mod.ExportedFunction(abi.AllocExport), mod.ExportedFunction(abi.EvaluateExport)
	i.batch = mod.ExportedFunction(abi.BatchExport)
	if i.compiled.interruptible {
		flag, ok := mod.ExportedGlobal(interruptExport).(api.MutableGlobal)
		if !ok {
			i.discard(ctx)
			return fmt.Errorf("instantiate: no mutable global %s", interruptExport)
		}
		i.watch = newWatchdog(flag)
	}
	cctx := i.begin(ctx, i.h.opts.InitTimeout)
	what, err := i.initialize(cctx)
	if st := i.end(ctx); err != nil {
		i.discard(ctx)
		if st == stopTimeout {
			err = fmt.Errorf("%w after %s: %w", errDeadline, i.h.opts.InitTimeout, err)
		}
		return fmt.Errorf("%s: %w", what, shortErr{firstLine(err.Error()) + i.stderr.suffix(), err})
	}
	if what != "" {
		i.discard(ctx)
		return fmt.Errorf("%s returned %s: the module refused its config (%s)", abi.InitExport, what, i.lastLog)
	}
	// Warm up: a language runtime's first call is slow (Go sizes its heap
	// and stacks), and it must not count against the per-call deadline.
	// Its output is not looked at; only losing the instance fails it.
	if !warm {
		return nil
	}
	if _, err := i.invokeEncoded(ctx, i.h.opts.InitTimeout, warmUpInput, len(warmUp.Endpoints), false); err != nil &&
		(err.Reason == ReasonTrap || err.Reason == ReasonTimeout || err.Reason == ReasonCanceled) {
		i.discard(ctx)
		return fmt.Errorf("warm-up call: %w", err)
	}
	return nil
}

// initialize runs the reactor initializer and ep_init with the config.
// On an error it returns which step failed; without one, a non-empty
// string is ep_init's non-zero status.
func (i *Instance) initialize(cctx context.Context) (string, error) {
	if f := i.mod.ExportedFunction(abi.InitializeExport); f != nil {
		if err := f.CallWithStack(cctx, i.stack[:]); err != nil {
			return abi.InitializeExport, err
		}
	}
	ptr, err := i.write(cctx, i.spec.Config)
	if err != nil {
		return "write config", err
	}
	i.stack[0], i.stack[1] = uint64(ptr), uint64(len(i.spec.Config))
	if err := i.mod.ExportedFunction(abi.InitExport).CallWithStack(cctx, i.stack[:]); err != nil {
		return abi.InitExport, err
	}
	if st := api.DecodeI32(i.stack[0]); st != 0 {
		return strconv.Itoa(int(st)), nil
	}
	return "", nil
}

// warmUp is the input of the call made right after instantiation.
var (
	warmUp      = ProbeInputs()[1].Input
	warmUpInput = abi.AppendInput(nil, &warmUp)
)

// write copies b into the guest buffer, asking ep_alloc for a bigger one
// (with room to grow) only when b does not fit the current one.
func (i *Instance) write(ctx context.Context, b []byte) (uint32, error) {
	if i.mod.IsClosed() { // its memory may be unmapped (the Host closed)
		return 0, errors.New("the module is closed")
	}
	if i.inCap == 0 || uint32(len(b)) > i.inCap {
		size := max(uint32(len(b)), 2*i.inCap, 4096)
		res, err := i.alloc.Call(ctx, uint64(size))
		if err != nil {
			return 0, err
		}
		i.inPtr, i.inCap = uint32(res[0]), size
	}
	if !i.mem.Write(i.inPtr, b) {
		ptr := i.inPtr
		i.inPtr, i.inCap = 0, 0
		return 0, fmt.Errorf("%s returned %#x for %d bytes, outside memory of %d bytes", abi.AllocExport, ptr, len(b), i.mem.Size())
	}
	return i.inPtr, nil
}

// Evaluate runs the module on in. A cached output is returned when the
// same encoded input was answered before. Failures are *CallError; a trap
// or timeout discards the wasm instance, and repeated failures open the
// circuit (see Breaker).
func (i *Instance) Evaluate(ctx context.Context, in *abi.Input) (Result, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.buf = abi.AppendInput(i.buf[:0], in)
	key := sha256.Sum256(i.buf)
	if out, ok := i.cache.get(key); ok {
		return Result{Output: cloneOutput(out), Cached: true}, nil
	}
	return i.evaluateEncoded(ctx, key, i.buf, len(in.Endpoints))
}

// evaluateEncoded calls ep_evaluate on one encoded input that is not in
// the cache (whose sha256 is key), with the breaker's rules, and caches a
// valid output.
func (i *Instance) evaluateEncoded(ctx context.Context, key [32]byte, input []byte, endpoints int) (Result, error) {
	now := i.h.opts.Now()
	if err := i.admit(ctx, now); err != nil {
		return Result{}, err
	}
	start := time.Now()
	out, err := i.invokeEncoded(ctx, i.h.opts.Timeout, input, endpoints, !i.spec.AllowEmpty)
	d := time.Since(start)
	if err != nil {
		return Result{Duration: d}, i.fail(ctx, now, err)
	}
	i.succeed(now)
	i.cache.put(key, out)
	return Result{Output: cloneOutput(out), Duration: d}, nil
}

// admit returns nil when the module may be called now, instantiating it
// when it was discarded and its backoff is over; otherwise the CallError
// to report (an instantiation failure is counted by the breaker).
func (i *Instance) admit(ctx context.Context, now time.Time) error {
	if now.Before(i.openUntil) {
		return i.callErr(ReasonCircuitOpen, fmt.Errorf("%w after %d consecutive failures, until %s", ErrCircuitOpen, i.failures, i.openUntil.Format(time.RFC3339)))
	}
	if i.compiled == nil {
		return i.callErr(ReasonCircuitOpen, fmt.Errorf("%w: instance closed", ErrCircuitOpen))
	}
	if i.mod == nil {
		if now.Before(i.retryAt) {
			return i.callErr(ReasonCircuitOpen, fmt.Errorf("%w: instance discarded, re-created after %s", ErrCircuitOpen, i.retryAt.Format(time.RFC3339Nano)))
		}
		if err := i.instantiate(ctx, true); err != nil {
			return i.fail(ctx, now, i.classify(ctx, stopNone, err))
		}
	}
	return nil
}

// succeed records a valid answer: it closes the circuit.
func (i *Instance) succeed(now time.Time) {
	i.failures, i.openFor = 0, 0
	if now.Before(i.openUntil) { // opened earlier in the same batch
		i.openUntil = now
	}
}

func (i *Instance) callErr(r Reason, err error) *CallError {
	return &CallError{Module: i.spec.Name, Reason: r, Err: err}
}

// fail records a failure for the breaker and returns err.
func (i *Instance) fail(ctx context.Context, now time.Time, err *CallError) error {
	if err.Reason == ReasonCanceled {
		if i.mod != nil && i.mod.IsClosed() {
			i.discard(ctx)
		}
		return err
	}
	i.failures++
	if err.Reason == ReasonTrap || err.Reason == ReasonTimeout {
		i.discard(ctx)
		// The first failure re-creates the instance at the next call: a
		// one-off (a guest GC pause on a busy node) must not fail every
		// service port evaluated during a backoff. Repeats back off.
		i.retryAt = now
		if i.failures > 1 {
			backoff := i.h.opts.Breaker.RetryBase << min(i.failures-2, 20)
			i.retryAt = now.Add(min(backoff, i.h.opts.Breaker.RetryMax))
		}
	}
	if i.failures >= i.h.opts.Breaker.Threshold {
		if i.openFor == 0 {
			i.openFor = i.h.opts.Breaker.OpenFor
		} else {
			i.openFor = min(2*i.openFor, i.h.opts.Breaker.OpenMax)
		}
		i.openUntil = now.Add(i.openFor)
	}
	return err
}

// invoke encodes in and calls the module (probes use it directly).
func (i *Instance) invoke(ctx context.Context, timeout time.Duration, in *abi.Input, rejectEmpty bool) (abi.Output, time.Duration, *CallError) {
	if i.mod == nil {
		if err := i.instantiate(ctx, false); err != nil {
			return abi.Output{}, 0, i.classify(ctx, stopNone, err)
		}
	}
	i.buf = abi.AppendInput(i.buf[:0], in)
	start := time.Now()
	out, err := i.invokeEncoded(ctx, timeout, i.buf, len(in.Endpoints), rejectEmpty)
	if err != nil && (err.Reason == ReasonTrap || err.Reason == ReasonTimeout) {
		i.discard(ctx)
	}
	return out, time.Since(start), err
}

// invokeEncoded calls ep_evaluate on the encoded input under a deadline,
// copies the output out of guest memory and validates the copy.
func (i *Instance) invokeEncoded(ctx context.Context, timeout time.Duration, input []byte, endpoints int, rejectEmpty bool) (abi.Output, *CallError) {
	if err := i.call(ctx, timeout, i.eval, input, maxOutput(endpoints), 1); err != nil {
		if err.Reason == ReasonInvalid && i.lastLog != "" {
			err.Err = fmt.Errorf("%w: %s", err.Err, i.lastLog)
		}
		return abi.Output{}, err
	}
	return i.checkOutput(i.out, endpoints, rejectEmpty)
}

// errReported is the error of an output of length 0.
var errReported = errors.New("the module reported a failure")

// call writes input into the guest, calls fn (ep_evaluate or
// ep_evaluate_batch) on it under a deadline and copies the output, at
// most limit bytes, into i.out. calls is the number of evaluations the
// call makes, for the log limit.
func (i *Instance) call(ctx context.Context, timeout time.Duration, fn api.Function, input []byte, limit uint32, calls int) *CallError {
	if err := ctx.Err(); err != nil {
		return i.callErr(ReasonCanceled, err)
	}
	i.logs, i.logLimit = 0, maxLogsPerCall*calls
	i.lastLog = ""
	cctx := i.begin(ctx, timeout)
	ptr, err := i.write(cctx, input)
	if err == nil {
		i.stack[0], i.stack[1] = uint64(ptr), uint64(len(input))
		err = fn.CallWithStack(cctx, i.stack[:])
	}
	if st := i.end(ctx); err != nil {
		return i.classify(ctx, st, err)
	}
	res := i.stack[:1]
	optr, olen := uint32(res[0]>>32), uint32(res[0])
	if olen == 0 {
		return i.callErr(ReasonInvalid, errReported)
	}
	if olen > limit {
		return i.callErr(ReasonInvalid, fmt.Errorf("output of %d bytes (limit %d)", olen, limit))
	}
	view, ok := i.mem.Read(optr, olen)
	if !ok {
		return i.callErr(ReasonInvalid, fmt.Errorf("output at %#x+%d is outside memory", optr, olen))
	}
	// Copy first: the checks must not look at memory the guest still owns.
	i.out = append(i.out[:0], view...)
	return nil
}

// checkOutput decodes and validates one output (a copy the guest cannot
// change) for an input of the given number of endpoints.
func (i *Instance) checkOutput(b []byte, endpoints int, rejectEmpty bool) (abi.Output, *CallError) {
	var out abi.Output
	if err := abi.DecodeOutput(b, &out); err != nil {
		return out, i.callErr(ReasonInvalid, err)
	}
	if err := out.Validate(endpoints); err != nil {
		return out, i.callErr(ReasonInvalid, err)
	}
	if rejectEmpty && out.AllZero() {
		return out, i.callErr(ReasonInvalid, fmt.Errorf("all %d endpoints dropped and the chain does not allow an empty service", endpoints))
	}
	return out, nil
}

// maxOutput bounds an output's encoding: header, weights, scheduler, flags
// and reason at their maximum sizes.
func maxOutput(endpoints int) uint32 {
	return uint32(8 + 4*endpoints + 2 + abi.MaxSchedulerLen + 2 + abi.MaxFlags*(2+32) + 2 + abi.MaxReasonLen)
}

// interruptTrap starts the error of a guest stopped by its interrupt
// check: a guest whose deadline passed while it failed on its own (an
// exit, a memory fault) is reported as the trap it is.
const interruptTrap = "wasm error: unreachable"

// classify turns a wazero error into a CallError. ctx is the caller's
// context, st how the call's deadline ended (end).
func (i *Instance) classify(ctx context.Context, st stop, err error) *CallError {
	if ctx.Err() != nil || st == stopCanceled {
		return i.callErr(ReasonCanceled, err)
	}
	if st == stopTimeout && (i.watch == nil || strings.HasPrefix(err.Error(), interruptTrap)) {
		return i.callErr(ReasonTimeout, fmt.Errorf("per-call %w: %w", errDeadline, shortErr{firstLine(err.Error()), err}))
	}
	if errors.Is(err, errDeadline) {
		return i.callErr(ReasonTimeout, err)
	}
	var ee *sys.ExitError
	if errors.As(err, &ee) {
		if ee.ExitCode() == sys.ExitCodeDeadlineExceeded {
			return i.callErr(ReasonTimeout, err)
		}
		return i.callErr(ReasonTrap, fmt.Errorf("module exited with code %d%s", ee.ExitCode(), i.stderr.suffix()))
	}
	return i.callErr(ReasonTrap, shortErr{firstLine(err.Error()) + i.stderr.suffix(), err})
}

// shortErr keeps an error's cause but shows only the given message:
// wazero's trap errors carry the whole wasm stack trace.
type shortErr struct {
	msg string
	err error
}

func (e shortErr) Error() string { return e.msg }
func (e shortErr) Unwrap() error { return e.err }

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func cloneOutput(o abi.Output) abi.Output {
	o.Weights = slices.Clone(o.Weights)
	o.SchedulerFlags = slices.Clone(o.SchedulerFlags)
	return o
}

// resultCache keeps at most max outputs in two generations: when the
// current one is full it becomes the old one, and hits in the old one move
// back. Cheap, bounded, and keeps what a sync keeps asking for.
type resultCache struct {
	cur, old map[[32]byte]abi.Output
	max      int
}

func (c *resultCache) get(k [32]byte) (abi.Output, bool) {
	if o, ok := c.cur[k]; ok {
		return o, true
	}
	if o, ok := c.old[k]; ok {
		c.put(k, o)
		return o, true
	}
	return abi.Output{}, false
}

func (c *resultCache) put(k [32]byte, o abi.Output) {
	if c.cur == nil || len(c.cur) >= max(c.max/2, 1) {
		c.old, c.cur = c.cur, make(map[[32]byte]abi.Output)
	}
	c.cur[k] = o
}

// tailBuffer keeps the first bytes a module writes to stdout/stderr (a Go
// panic message, say) for error messages.
type tailBuffer struct{ b []byte }

const tailMax = 1024

func (t *tailBuffer) Write(p []byte) (int, error) {
	if room := tailMax - len(t.b); room > 0 {
		t.b = append(t.b, p[:min(len(p), room)]...)
	}
	return len(p), nil
}

func (t *tailBuffer) reset() { t.b = t.b[:0] }

func (t *tailBuffer) suffix() string {
	if len(t.b) == 0 {
		return ""
	}
	return fmt.Sprintf(" (module output: %.300q)", t.b)
}
