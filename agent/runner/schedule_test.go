package runner

// These tests drive the scheduling logic (tick) synchronously from the test
// goroutine with a clock that moves only when told, so they can assert both
// that a run happens and that it does not. loop_test.go covers the Loop
// goroutine around it.

import (
	"context"
	"errors"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

// nowClock is a Clock for tick, which only reads the time.
type nowClock struct{ now time.Time }

func (c *nowClock) Now() time.Time               { return c.now }
func (c *nowClock) NewTimer(time.Duration) Timer { panic("tick does not use timers") }

const (
	minI   = 1 * time.Second
	retryI = 5 * time.Second
	maxI   = 30 * time.Second
)

// outcome is what the work function does on one run.
type outcome int

const (
	succeed outcome = iota
	fail
	panicking
	requestAgain // succeed, but call Run while running
)

type harness struct {
	t        *testing.T
	clk      *nowClock
	r        *Runner
	runs     []time.Time // fake time at the start of each run
	outcomes []outcome   // consumed one per run; succeed when empty
	// during, if set, is called inside the work function.
	during func()
}

func newHarness(t *testing.T, minInterval, retryInterval, maxInterval time.Duration) *harness {
	h := &harness{t: t, clk: &nowClock{now: t0}}
	h.r = New("test", h.work, minInterval, retryInterval, maxInterval, h.clk)
	if !h.r.begin() {
		t.Fatal("begin: already looping")
	}
	return h
}

func (h *harness) work(context.Context) error {
	h.runs = append(h.runs, h.clk.now)
	if h.during != nil {
		h.during()
	}
	o := succeed
	if len(h.outcomes) > 0 {
		o, h.outcomes = h.outcomes[0], h.outcomes[1:]
	}
	switch o {
	case fail:
		return errors.New("boom")
	case panicking:
		panic("kaboom")
	case requestAgain:
		h.r.Run()
	}
	return nil
}

// at sets the fake time to t0+d.
func (h *harness) at(d time.Duration) { h.clk.now = t0.Add(d) }

// tick runs tick at the current fake time and checks the number of runs
// so far and when the next one is due (zero wantNext: none due).
func (h *harness) tick(wantRuns int, wantNext time.Duration) {
	h.t.Helper()
	next, ok := h.r.tick(context.Background())
	if len(h.runs) != wantRuns {
		h.t.Fatalf("at +%v: %d runs (%v), want %d", h.clk.now.Sub(t0), len(h.runs), h.runs, wantRuns)
	}
	if wantNext == 0 {
		if ok {
			h.t.Fatalf("at +%v: next run due at +%v, want none", h.clk.now.Sub(t0), next.Sub(t0))
		}
		return
	}
	if !ok || !next.Equal(t0.Add(wantNext)) {
		h.t.Fatalf("at +%v: next run due at +%v (ok %v), want +%v", h.clk.now.Sub(t0), next.Sub(t0), ok, wantNext)
	}
}

func (h *harness) lastRunAt(want time.Duration) {
	h.t.Helper()
	if got := h.runs[len(h.runs)-1]; !got.Equal(t0.Add(want)) {
		h.t.Fatalf("last run started at +%v, want +%v", got.Sub(t0), want)
	}
}

func TestNoRunWithoutReason(t *testing.T) {
	h := newHarness(t, minI, retryI, maxI)
	h.tick(0, maxI) // only the max interval is pending
	h.at(maxI - time.Nanosecond)
	h.tick(0, maxI)
}

func TestCoalescing(t *testing.T) {
	h := newHarness(t, minI, retryI, maxI)
	for range 5 {
		h.r.Run()
	}
	h.tick(1, maxI) // one run serves all five requests
	h.at(10 * time.Second)
	h.tick(1, maxI)

	// Requests during the min interval wait for it and coalesce too.
	h.at(20 * time.Second)
	h.r.Run()
	h.tick(2, 20*time.Second+maxI)
	h.at(20*time.Second + 100*time.Millisecond)
	h.r.Run()
	h.r.Run()
	h.tick(2, 20*time.Second+minI)
	h.at(20*time.Second + 500*time.Millisecond)
	h.r.Run()
	h.tick(2, 20*time.Second+minI)
	h.at(20*time.Second + minI)
	h.tick(3, 20*time.Second+minI+maxI)
	h.lastRunAt(20*time.Second + minI)
}

func TestMinInterval(t *testing.T) {
	h := newHarness(t, minI, retryI, maxI)
	// A request made while running is served one min interval after the
	// run ends, not at once.
	h.outcomes = []outcome{requestAgain, requestAgain, succeed}
	h.r.Run()
	h.tick(1, minI)
	h.at(minI - time.Nanosecond)
	h.tick(1, minI)
	h.at(minI)
	h.tick(2, 2*minI)
	h.at(2 * minI)
	h.tick(3, 2*minI+maxI)
}

func TestZeroMinIntervalRunsBackToBack(t *testing.T) {
	h := newHarness(t, 0, 0, maxI)
	h.outcomes = []outcome{requestAgain, requestAgain, succeed}
	h.r.Run()
	h.tick(3, maxI)
}

func TestMaxInterval(t *testing.T) {
	h := newHarness(t, minI, retryI, maxI)
	h.at(maxI)
	h.tick(1, 2*maxI) // nobody asked; the max interval did
	h.at(maxI + 10*time.Second)
	h.r.Run()
	h.tick(2, 2*maxI+10*time.Second) // a run restarts the max interval
	h.at(2*maxI + 10*time.Second)
	h.tick(3, 3*maxI+10*time.Second)
}

func TestMaxIntervalDisabled(t *testing.T) {
	h := newHarness(t, minI, retryI, 0)
	h.tick(0, 0)
	h.r.Run()
	h.tick(1, 0)
	h.at(24 * time.Hour)
	h.tick(1, 0)
}

func TestMaxIntervalBelowMinIsRaised(t *testing.T) {
	h := newHarness(t, 10*time.Second, retryI, time.Second)
	h.tick(0, 10*time.Second)
}

func TestRetry(t *testing.T) {
	h := newHarness(t, minI, retryI, maxI)
	h.outcomes = []outcome{fail, fail, succeed}
	h.r.Run()
	h.tick(1, retryI)
	if s := h.r.Status(); s.Failures != 1 || s.LastError == nil || !s.LastSuccess.IsZero() {
		t.Fatalf("after a failure: %+v", s)
	}
	h.at(retryI)
	h.tick(2, 2*retryI)
	h.at(2 * retryI)
	h.tick(3, 2*retryI+maxI) // success cancels the retry
	if s := h.r.Status(); s.Failures != 0 || s.LastError != nil || !s.LastSuccess.Equal(t0.Add(2*retryI)) || s.Runs != 3 {
		t.Fatalf("after a success: %+v", s)
	}
}

func TestRequestBeatsRetry(t *testing.T) {
	h := newHarness(t, minI, retryI, maxI)
	h.outcomes = []outcome{fail}
	h.r.Run()
	h.tick(1, retryI)
	h.at(2 * time.Second)
	h.r.Run()
	h.tick(2, 2*time.Second+maxI)
}

func TestRetryNotSoonerThanMinInterval(t *testing.T) {
	h := newHarness(t, 10*time.Second, time.Second, maxI)
	h.outcomes = []outcome{fail}
	h.r.Run()
	h.tick(1, 10*time.Second)
}

func TestPanicRecovered(t *testing.T) {
	h := newHarness(t, minI, retryI, maxI)
	h.outcomes = []outcome{panicking, succeed}
	h.r.Run()
	h.tick(1, retryI) // a panic is a failure: retried
	s := h.r.Status()
	if !errors.Is(s.LastError, ErrPanic) || s.Failures != 1 {
		t.Fatalf("after a panic: %+v", s)
	}
	h.at(retryI)
	h.tick(2, retryI+maxI)
	if s := h.r.Status(); s.LastError != nil {
		t.Fatalf("after recovery: %+v", s)
	}
}

func TestPanicWithErrorKeepsIt(t *testing.T) {
	sentinel := errors.New("sentinel")
	r := New("p", func(context.Context) error { panic(sentinel) }, 0, 0, 0, &nowClock{now: t0})
	err := r.call(context.Background())
	if !errors.Is(err, ErrPanic) || !errors.Is(err, sentinel) {
		t.Fatalf("call() = %v, want ErrPanic wrapping sentinel", err)
	}
}

func TestPendingSince(t *testing.T) {
	h := newHarness(t, minI, retryI, maxI)
	pending := func(want time.Duration) {
		t.Helper()
		got := h.r.Status().PendingSince
		if want < 0 {
			if !got.IsZero() {
				t.Fatalf("PendingSince = +%v, want none", got.Sub(t0))
			}
			return
		}
		if !got.Equal(t0.Add(want)) {
			t.Fatalf("PendingSince = %v, want +%v", got, want)
		}
	}
	pending(-1)
	h.at(time.Second)
	h.r.Run()
	h.at(2 * time.Second)
	h.r.Run() // later requests do not move the oldest
	pending(time.Second)

	// During the run the taken-over requests stay pending; a failed run
	// leaves them pending.
	h.outcomes = []outcome{fail}
	h.during = func() { pending(time.Second) }
	h.tick(1, 2*time.Second+retryI)
	pending(time.Second)

	// A request during the retry wait does not hide the older one; the
	// success covers both.
	h.during = nil
	h.at(2*time.Second + 500*time.Millisecond)
	h.r.Run()
	pending(time.Second)
	h.at(3 * time.Second)
	h.tick(2, 3*time.Second+maxI)
	pending(-1)

	// A request made while a run is in progress is not covered by it.
	h.at(10 * time.Second)
	h.r.Run()
	h.during = func() { h.clk.now = t0.Add(11 * time.Second); h.r.Run() }
	h.tick(3, 11*time.Second+minI)
	pending(11 * time.Second)
	h.during = nil
	h.at(11*time.Second + minI)
	h.tick(4, 11*time.Second+minI+maxI)
	pending(-1)

	// A periodic run that fails creates no pending request.
	h.outcomes = []outcome{fail}
	h.at(11*time.Second + minI + maxI)
	h.tick(5, 11*time.Second+minI+maxI+retryI)
	pending(-1)
}

func TestCancelledContextStopsTick(t *testing.T) {
	h := newHarness(t, minI, retryI, maxI)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	h.r.Run()
	if _, ok := h.r.tick(ctx); ok || len(h.runs) != 0 {
		t.Fatalf("tick with a cancelled context: ok %v, %d runs", ok, len(h.runs))
	}
}

func TestOneLoopAtATime(t *testing.T) {
	h := newHarness(t, minI, retryI, maxI) // begin already called
	if h.r.begin() {
		t.Fatal("second begin succeeded while the first loop runs")
	}
}

func TestRestStretchesOnlyThePeriodicRun(t *testing.T) {
	const rest = time.Hour
	h := newHarness(t, minI, retryI, maxI)
	resting := true
	h.during = func() {
		if resting {
			h.r.Rest(rest)
		}
	}
	h.at(maxI)
	h.tick(1, maxI+rest) // the periodic run rested: the next waits an hour
	h.at(maxI + rest - time.Nanosecond)
	h.tick(1, maxI+rest)

	// A request is served at once, and a run that does not rest puts the
	// max interval back.
	h.at(2 * maxI)
	resting = false
	h.r.Run()
	h.tick(2, 3*maxI)
	h.at(3 * maxI)
	h.tick(3, 4*maxI)
}

func TestRestDoesNotDelayRetryOrShorten(t *testing.T) {
	h := newHarness(t, minI, retryI, maxI)
	h.during = func() { h.r.Rest(time.Hour) }
	h.outcomes = []outcome{fail}
	h.r.Run()
	h.tick(1, retryI) // a failed run is retried as usual
	h.at(retryI)
	h.tick(2, retryI+time.Hour)

	// A rest shorter than the max interval changes nothing, and so does a
	// call outside a run.
	h.during = func() { h.r.Rest(time.Second) }
	h.r.Rest(24 * time.Hour)
	h.r.Run()
	h.tick(2, retryI+minI)
	h.at(retryI + minI)
	h.tick(3, retryI+minI+maxI)
}

func TestUnrest(t *testing.T) {
	h := newHarness(t, minI, retryI, maxI)
	h.during = func() { h.r.Rest(time.Hour) }
	h.at(maxI)
	h.tick(1, maxI+time.Hour)
	// After the run that rested: the periodic run is back on the max
	// interval from its end...
	h.at(maxI + time.Second)
	h.r.Unrest()
	h.tick(1, 2*maxI)
	h.at(2 * maxI)
	h.tick(2, 2*maxI+time.Hour)
	// ... and due at once when that has passed.
	late := 2*maxI + 10*time.Minute
	h.at(late)
	h.r.Unrest()
	h.tick(3, late+time.Hour)
	h.lastRunAt(late)

	// During the run that rests, after its Rest: that rest does not count.
	h.during = func() {
		h.r.Rest(time.Hour)
		h.r.Unrest()
	}
	h.at(late + time.Minute)
	h.r.Run()
	h.tick(4, late+time.Minute+maxI)

	// Without a rest, nothing changes.
	h.during = nil
	h.r.Unrest()
	h.tick(4, late+time.Minute+maxI)
}
