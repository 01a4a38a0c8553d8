// Package runner owns the timing of the agent's sync: one function, run on
// request but never more often than a minimum interval, retried after a
// failure, and run at least once per maximum interval even when nobody asks.
//
// The shape follows kube-proxy's BoundedFrequencyRunner: Run is a
// non-blocking request, requests made before the next run coalesce into that
// one run, the work function returns an error, and a panic in it is recovered
// and counted as an error. Unlike kube-proxy's, a request made before Loop
// starts is kept, the work function receives the loop's context, and the
// runner reports what a health check needs (Status): when the oldest request
// not yet covered by a successful run was made, and when the last success
// ended.
//
// Time comes from an injected Clock, so tests step a fake clock
// (package runnertest) instead of sleeping.
package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"
)

// Clock is the runner's source of time.
type Clock interface {
	Now() time.Time
	// NewTimer returns a running timer that fires once after d.
	NewTimer(d time.Duration) Timer
}

// Timer is a one-shot timer. Like time.Timer since Go 1.23, after Stop or
// Reset returns no value from before the call is received from C.
type Timer interface {
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it was
	// running.
	Stop() bool
	// Reset makes the timer fire after d; it reports whether it was
	// running.
	Reset(d time.Duration) bool
}

// RealClock is the wall clock.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// NewTimer wraps time.NewTimer.
func (RealClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time        { return t.t.C }
func (t realTimer) Stop() bool                 { return t.t.Stop() }
func (t realTimer) Reset(d time.Duration) bool { return t.t.Reset(d) }

// ErrPanic is wrapped by the error recorded for a run whose function
// panicked: errors.Is(status.LastError, ErrPanic).
var ErrPanic = errors.New("panic")

// Status is a snapshot of the runner's state.
type Status struct {
	// PendingSince is when the oldest request (Run call) not yet covered by
	// a successful run was made; zero when every request is covered. A
	// request is covered by a successful run that started after it. A
	// failed run leaves its requests pending until a later run succeeds.
	PendingSince time.Time
	// LastSuccess is when the last successful run ended; zero if none.
	LastSuccess time.Time
	// LastRun is when the last run ended, successful or not; zero if none.
	LastRun time.Time
	// LastError is the error of the last run; nil after a success.
	LastError error
	// Failures counts consecutive failed runs; 0 after a success.
	Failures int
	// Runs counts all runs.
	Runs uint64
}

// Runner runs one function with bounded frequency. Create it with New, call
// Loop once (typically in its own goroutine), and call Run from anywhere.
type Runner struct {
	name                 string
	fn                   func(context.Context) error
	clk                  Clock
	wake                 chan struct{} // capacity 1: a buffered wake-up is a coalesced request
	mu                   sync.Mutex    // guards everything below
	min, retry, max      time.Duration // changed by SetIntervals
	log                  *slog.Logger
	looping              bool
	requested            bool      // a run was requested since the last run started
	pendingSince         time.Time // see Status.PendingSince
	inflightSince        time.Time // PendingSince as the current run took it over
	lastEnd, lastSuccess time.Time
	retryAt, maxAt       time.Time     // zero: not scheduled
	rest                 time.Duration // asked for by the running run (see Rest)
	lastErr              error
	failures             int
	runs                 uint64
}

// New returns a runner named name (used in logs and errors) for fn.
//
//   - minInterval is the least time from the end of one run to the start of
//     the next; requests made in between wait and coalesce. Negative is 0.
//   - retryInterval is how long after a failed run it runs again, unless a
//     request or the max interval makes it run sooner (but never sooner than
//     minInterval). Zero or negative retries as soon as minInterval allows.
//   - maxInterval is the longest time from the end of one run (or from the
//     start of Loop) to the start of the next. Zero or negative disables
//     periodic runs; a positive value below minInterval is raised to it.
//
// clk is the source of time; nil means RealClock. The runner logs through
// slog.Default() with the attribute runner=name; see SetLogger.
func New(name string, fn func(context.Context) error, minInterval, retryInterval, maxInterval time.Duration, clk Clock) *Runner {
	if clk == nil {
		clk = RealClock{}
	}
	minInterval = max(minInterval, 0)
	if retryInterval <= 0 {
		retryInterval = minInterval
	}
	if maxInterval < 0 {
		maxInterval = 0
	}
	if maxInterval > 0 && maxInterval < minInterval {
		maxInterval = minInterval
	}
	return &Runner{
		name:  name,
		fn:    fn,
		min:   minInterval,
		retry: retryInterval,
		max:   maxInterval,
		clk:   clk,
		log:   slog.Default().With("runner", name),
		wake:  make(chan struct{}, 1),
	}
}

// SetLogger replaces the logger (the attribute runner=name is added).
func (r *Runner) SetLogger(l *slog.Logger) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = l.With("runner", r.name)
}

func (r *Runner) logger() *slog.Logger {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.log
}

// Run requests a run as soon as the min interval allows. It never blocks.
// Requests made before that run starts, including before Loop starts, are
// served by that one run.
func (r *Runner) Run() {
	r.mu.Lock()
	r.requested = true
	if r.pendingSince.IsZero() {
		r.pendingSince = r.clk.Now()
	}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default: // a wake-up is already queued: coalesced
	}
}

// Rest is called by the work function during a run that found nothing the
// periodic runs guard against: the next periodic run may wait d after this
// run ends instead of the max interval. It is never a reason to run later
// when asked: a request runs as soon as the min interval allows, a failed
// run is retried as usual, and the run after this one is back on the max
// interval unless it rests too. A d not above the max interval, or a call
// outside a run, changes nothing.
//
// kube-proxy's nftables and iptables modes run periodically once an hour;
// a caller that can tell a quiet period from a busy one rests as long.
func (r *Runner) Rest(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rest = max(r.rest, d) // outside a run: cleared before it counts
}

// Unrest takes back a rest: something the periodic runs guard against
// turned up after the run that rested ended (or while it runs), so the
// next periodic run is due the max interval after the last run's end
// again (at once, when that has passed). It never blocks, and without a
// rest it changes nothing.
func (r *Runner) Unrest() {
	r.mu.Lock()
	r.rest = 0 // a run in progress that rested
	at := r.lastEnd.Add(r.max)
	cut := r.max > 0 && !r.lastEnd.IsZero() && r.maxAt.After(at)
	if cut {
		r.maxAt = at
	}
	r.mu.Unlock()
	if cut {
		select {
		case r.wake <- struct{}{}: // the loop sets its timer again
		default:
		}
	}
}

// Status returns a snapshot of the runner's state, safe to call from any
// goroutine.
func (r *Runner) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Status{
		PendingSince: r.pendingSince,
		LastSuccess:  r.lastSuccess,
		LastRun:      r.lastEnd,
		LastError:    r.lastErr,
		Failures:     r.failures,
		Runs:         r.runs,
	}
	// A run in progress has taken over the older requests; they stay
	// pending until it succeeds.
	if !r.inflightSince.IsZero() {
		s.PendingSince = r.inflightSince
	}
	return s
}

// Loop runs the function whenever it is due, until ctx is done; the context
// passed to the function is ctx. A run in progress when ctx ends is not
// interrupted other than through its context; Loop returns after it. Loop
// must not be called again while it runs (a second call logs and returns).
func (r *Runner) Loop(ctx context.Context) {
	if !r.begin() {
		r.logger().Error("runner: Loop called while already looping")
		return
	}
	defer func() {
		r.mu.Lock()
		r.looping = false
		r.mu.Unlock()
	}()

	r.mu.Lock()
	r.log.Debug("loop starting", "minInterval", r.min, "retryInterval", r.retry, "maxInterval", r.max)
	r.mu.Unlock()
	timer := r.clk.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		next, ok := r.tick(ctx)
		if ctx.Err() != nil {
			r.logger().Debug("loop stopping")
			return
		}
		if ok {
			timer.Reset(next.Sub(r.clk.Now()))
		} else {
			timer.Stop()
		}
		select {
		case <-ctx.Done():
			r.logger().Debug("loop stopping")
			return
		case <-r.wake:
		case <-timer.C():
		}
	}
}

// begin marks the loop as running and starts the max-interval clock; it
// reports false if a loop already runs.
func (r *Runner) begin() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.looping {
		return false
	}
	r.looping = true
	if r.max > 0 && r.maxAt.IsZero() {
		r.maxAt = r.clk.Now().Add(r.max)
	}
	return true
}

// tick runs the function while it is due and returns when it is next due
// (ok false: only a request can make it due).
func (r *Runner) tick(ctx context.Context) (next time.Time, ok bool) {
	for ctx.Err() == nil {
		next, ok = r.due()
		if !ok || r.clk.Now().Before(next) {
			return next, ok
		}
		r.runOnce(ctx)
	}
	return time.Time{}, false
}

// due returns when the next run should start: the earliest of a pending
// request, a scheduled retry and the max-interval deadline, but not before
// the min interval since the last run has passed.
func (r *Runner) due() (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var at time.Time
	ok := false
	consider := func(t time.Time) {
		if !ok || t.Before(at) {
			at, ok = t, true
		}
	}
	if r.requested {
		consider(time.Time{}) // now, as far as the min interval allows
	}
	if !r.retryAt.IsZero() {
		consider(r.retryAt)
	}
	if !r.maxAt.IsZero() {
		consider(r.maxAt)
	}
	if !ok {
		return time.Time{}, false
	}
	if !r.lastEnd.IsZero() {
		if earliest := r.lastEnd.Add(r.min); at.Before(earliest) {
			at = earliest
		}
	}
	return at, true
}

// runOnce runs the function once and schedules what follows.
func (r *Runner) runOnce(ctx context.Context) {
	r.mu.Lock()
	r.requested = false
	r.inflightSince, r.pendingSince = r.pendingSince, time.Time{}
	r.rest = 0
	r.mu.Unlock()

	start := r.clk.Now()
	err := r.call(ctx)
	end := r.clk.Now()

	r.mu.Lock()
	r.runs++
	r.lastEnd = end
	if r.max > 0 {
		r.maxAt = end.Add(max(r.max, r.rest))
	}
	r.rest = 0
	if err != nil {
		r.failures++
		r.lastErr = err
		r.retryAt = end.Add(r.retry)
		// Requests this run took over are older than any made during it.
		if !r.inflightSince.IsZero() {
			r.pendingSince = r.inflightSince
		}
	} else {
		r.failures = 0
		r.lastErr = nil
		r.retryAt = time.Time{}
		r.lastSuccess = end
	}
	r.inflightSince = time.Time{}
	failures, retry, log := r.failures, r.retry, r.log
	r.mu.Unlock()

	if err != nil {
		log.Warn("run failed, will retry", "err", err, "took", end.Sub(start), "retryIn", retry, "consecutiveFailures", failures)
	} else {
		log.Debug("run done", "took", end.Sub(start))
	}
}

// call runs fn, turning a panic into an error that wraps ErrPanic.
func (r *Runner) call(ctx context.Context) (err error) {
	defer func() {
		if v := recover(); v != nil {
			r.logger().Error("run panicked", "panic", v, "stack", string(debug.Stack()))
			if e, isErr := v.(error); isErr {
				err = fmt.Errorf("runner %s: %w: %w", r.name, ErrPanic, e)
			} else {
				err = fmt.Errorf("runner %s: %w: %v", r.name, ErrPanic, v)
			}
		}
	}()
	return r.fn(ctx)
}
