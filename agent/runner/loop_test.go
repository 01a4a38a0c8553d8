package runner_test

// These tests run the real Loop goroutine against a fake clock. They wait
// only for things that must happen (a run, a timer armed for a given
// deadline, Loop returning); the guard context merely turns a hang into a
// failure. Negative cases ("no run") are checked once the loop is known to
// wait for a later deadline, or in schedule_test.go.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/agent/runner"
	"github.com/edgeproxy/edgeproxy/agent/runner/runnertest"
)

var start = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

const (
	minInterval   = time.Second
	retryInterval = 5 * time.Second
	maxInterval   = 30 * time.Second
)

// loopHarness runs a Runner's Loop on a fake clock. The work function
// reports each run's fake start time on runs and returns what results says
// (nil when nothing is queued).
type loopHarness struct {
	t       *testing.T
	clk     *runnertest.Clock
	r       *runner.Runner
	runs    chan time.Time
	results chan func() error
	guard   context.Context
	cancel  context.CancelFunc
	done    chan struct{}
}

func startLoop(t *testing.T, before func(*runner.Runner)) *loopHarness {
	t.Helper()
	h := &loopHarness{
		t:       t,
		clk:     runnertest.NewClock(start),
		runs:    make(chan time.Time, 100),
		results: make(chan func() error, 100),
		done:    make(chan struct{}),
	}
	h.r = runner.New("loop-test", h.work, minInterval, retryInterval, maxInterval, h.clk)
	// The guard bounds every wait of the test; it is not part of what is
	// tested (no assertion depends on real time).
	var cancelGuard context.CancelFunc
	h.guard, cancelGuard = context.WithTimeout(context.Background(), 30*time.Second)
	if before != nil {
		before(h.r)
	}
	var ctx context.Context
	ctx, h.cancel = context.WithCancel(context.Background())
	go func() {
		defer close(h.done)
		h.r.Loop(ctx)
	}()
	t.Cleanup(func() {
		h.cancel()
		<-h.done
		cancelGuard()
	})
	return h
}

func (h *loopHarness) work(ctx context.Context) error {
	h.runs <- h.clk.Now()
	select {
	case f := <-h.results:
		return f()
	default:
		return nil
	}
}

// waitRun waits for the next run and checks its fake start time.
func (h *loopHarness) waitRun(at time.Duration) {
	h.t.Helper()
	select {
	case got := <-h.runs:
		if !got.Equal(start.Add(at)) {
			h.t.Fatalf("run at +%v, want +%v", got.Sub(start), at)
		}
	case <-h.guard.Done():
		h.t.Fatalf("no run (wanted one at +%v)", at)
	}
}

// waitArmed waits until the loop waits for fake time start+at.
func (h *loopHarness) waitArmed(at time.Duration) {
	h.t.Helper()
	if err := h.clk.WaitArmed(h.guard, start.Add(at)); err != nil {
		h.t.Fatal(err)
	}
}

func (h *loopHarness) noMoreRuns() {
	h.t.Helper()
	select {
	case got := <-h.runs:
		h.t.Fatalf("unexpected run at +%v", got.Sub(start))
	default:
	}
}

func TestLoopCoalescesAndKeepsMinInterval(t *testing.T) {
	h := startLoop(t, nil)
	h.waitArmed(maxInterval) // idle: only the max interval is pending
	// Each wait below is for a deadline that exists only once the loop has
	// finished the step before, so the fake time never moves under a run.
	h.clk.Step(2 * time.Second)
	h.r.Run()
	h.waitRun(2 * time.Second)
	h.waitArmed(2*time.Second + maxInterval)

	h.clk.Step(100 * time.Millisecond)
	for range 3 {
		h.r.Run()
	}
	h.waitArmed(2*time.Second + minInterval) // deferred to the end of the min interval
	h.noMoreRuns()
	h.clk.Step(900 * time.Millisecond)
	h.waitRun(2*time.Second + minInterval) // one run for three requests
	h.waitArmed(2*time.Second + minInterval + maxInterval)
	h.noMoreRuns()
}

func TestLoopKeepsRequestMadeBeforeStart(t *testing.T) {
	h := startLoop(t, func(r *runner.Runner) { r.Run() })
	h.waitRun(0)
	h.waitArmed(maxInterval)
	h.noMoreRuns()
}

func TestLoopMaxInterval(t *testing.T) {
	h := startLoop(t, nil)
	h.waitArmed(maxInterval)
	h.noMoreRuns()
	h.clk.Step(maxInterval)
	h.waitRun(maxInterval)
	h.waitArmed(2 * maxInterval)
	h.clk.Step(maxInterval)
	h.waitRun(2 * maxInterval)
	h.waitArmed(3 * maxInterval)
}

func TestLoopRetriesAfterErrorAndPanic(t *testing.T) {
	h := startLoop(t, nil)
	h.results <- func() error { return errors.New("apply failed") }
	h.r.Run()
	h.waitRun(0)
	h.waitArmed(retryInterval)
	if s := h.r.Status(); s.Failures != 1 || s.LastError == nil {
		t.Fatalf("status after error: %+v", s)
	}

	h.results <- func() error { panic("bug in sync") }
	h.clk.Step(retryInterval)
	h.waitRun(retryInterval)
	h.waitArmed(2 * retryInterval) // the loop survived the panic and retries
	if s := h.r.Status(); s.Failures != 2 || !errors.Is(s.LastError, runner.ErrPanic) {
		t.Fatalf("status after panic: %+v", s)
	}

	h.clk.Step(retryInterval)
	h.waitRun(2 * retryInterval)
	h.waitArmed(2*retryInterval + maxInterval)
	if s := h.r.Status(); s.Failures != 0 || s.LastError != nil || !s.LastSuccess.Equal(start.Add(2*retryInterval)) || !s.PendingSince.IsZero() {
		t.Fatalf("status after recovery: %+v", s)
	}
}

func TestLoopEndsWithContext(t *testing.T) {
	h := startLoop(t, nil)
	h.waitArmed(maxInterval)
	h.cancel()
	select {
	case <-h.done:
	case <-h.guard.Done():
		t.Fatal("Loop did not return after its context ended")
	}
	h.r.Run() // harmless after the loop ended
	h.clk.Step(time.Hour)
	h.noMoreRuns()
	if got := h.clk.Armed(); len(got) != 0 {
		t.Errorf("timers left armed after Loop returned: %v", got)
	}
}

func TestLoopCancelsRunningWork(t *testing.T) {
	clk := runnertest.NewClock(start)
	started := make(chan struct{})
	var workErr error
	r := runner.New("cancel-test", func(ctx context.Context) error {
		close(started)
		<-ctx.Done() // the work sees the loop's context end
		workErr = ctx.Err()
		return workErr
	}, minInterval, retryInterval, maxInterval, clk)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Loop(ctx)
	}()
	r.Run()
	guard, stop := context.WithTimeout(context.Background(), 30*time.Second)
	defer stop()
	select {
	case <-started:
	case <-guard.Done():
		t.Fatal("work never started")
	}
	cancel()
	select {
	case <-done:
	case <-guard.Done():
		t.Fatal("Loop did not return")
	}
	if !errors.Is(workErr, context.Canceled) {
		t.Fatalf("work returned %v, want context.Canceled", workErr)
	}
}

func TestLoopPicksUpNewIntervals(t *testing.T) {
	h := startLoop(t, nil)
	h.waitArmed(maxInterval)
	h.clk.Step(time.Second)
	h.r.SetIntervals(minInterval, retryInterval, 10*time.Second)
	h.waitArmed(11 * time.Second) // re-armed without a run: no last run, so from now
	h.noMoreRuns()
	h.clk.Step(10 * time.Second)
	h.waitRun(11 * time.Second)
	h.waitArmed(21 * time.Second)
}
