package policy

import (
	"context"
	"errors"
	"time"

	"github.com/tetratelabs/wazero/api"
)

// errDeadline is wrapped by the errors of a call or an initialization
// that ran out of time.
var errDeadline = errors.New("deadline exceeded")

// stop says how a call's deadline ended.
type stop int

const (
	stopNone     stop = iota // the call returned in time
	stopTimeout              // its own timeout passed
	stopCanceled             // the caller's context ended first
)

// watchdog stops an interruptible wasm instance (instrument) that
// overruns its deadline: a timer, started for each call, sets the
// interrupt global, and the guest traps at its next check's slow path. A
// call costs a timer started and stopped (a new one each time, added as
// any time.AfterFunc is): no goroutine, channel or context per call,
// unlike wazero's WithCloseOnContextDone. The timer's goroutine needs the
// scheduler, which the check's periodic exit to Go lets stop the guest's
// goroutine (checkPeriod).
type watchdog struct {
	flag  api.MutableGlobal
	timer *time.Timer   // of the current call
	fired chan struct{} // one token per firing, taken by disarm
	// byCaller: the armed deadline is the caller's context's, which came
	// before the call's own timeout.
	byCaller bool
}

func newWatchdog(flag api.MutableGlobal) *watchdog {
	return &watchdog{flag: flag, fired: make(chan struct{}, 1)}
}

// fire runs on the timer's goroutine while the owner's call runs.
func (w *watchdog) fire() {
	w.flag.Set(1)
	w.fired <- struct{}{}
}

// arm starts the deadline: the earlier of timeout and ctx's deadline.
func (w *watchdog) arm(ctx context.Context, timeout time.Duration) {
	w.byCaller = false
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl); left < timeout {
			timeout, w.byCaller = left, true
		}
	}
	w.timer = time.AfterFunc(timeout, w.fire)
}

// disarm stops the timer. If it fired, it waits until fire is done,
// clears the flag for the next call (a call that returned in time anyway
// keeps its answer) and reports which deadline passed.
func (w *watchdog) disarm() stop {
	if w.timer.Stop() {
		return stopNone
	}
	<-w.fired
	w.flag.Set(0)
	if w.byCaller {
		return stopCanceled
	}
	return stopTimeout
}

// begin starts a call's deadline and returns the context to call the
// guest with; end stops it. An interruptible instance is stopped by its
// watchdog, and the context carries only the instance for hostLog; any
// other is stopped by wazero when the context's deadline passes.
func (i *Instance) begin(ctx context.Context, timeout time.Duration) context.Context {
	if i.watch != nil {
		i.watch.arm(ctx, timeout)
		return i.callCtx
	}
	i.deadline, i.cancel = context.WithTimeout(ctx, timeout)
	return context.WithValue(i.deadline, callKey{}, i)
}

// end stops the deadline begin started, and says how it ended.
func (i *Instance) end(ctx context.Context) stop {
	if i.watch != nil {
		return i.watch.disarm()
	}
	st := stopNone
	if ctx.Err() != nil {
		st = stopCanceled
	} else if i.deadline.Err() != nil {
		st = stopTimeout
	}
	i.cancel()
	i.deadline, i.cancel = nil, nil
	return st
}
