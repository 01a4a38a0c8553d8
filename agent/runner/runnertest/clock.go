// Package runnertest provides a fake runner.Clock whose time moves only
// when a test steps it, so tests of timing never sleep.
package runnertest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/edgeproxy/edgeproxy/agent/runner"
)

// Clock is a fake runner.Clock. Its time starts where NewClock puts it and
// moves only through Step and Set, which fire the timers that fall due, in
// deadline order, each with its own deadline as the value. It is safe for
// concurrent use.
type Clock struct {
	mu      sync.Mutex
	now     time.Time
	timers  []*timer
	changed chan struct{} // closed and replaced whenever a timer is armed, stopped or fired
}

var _ runner.Clock = (*Clock)(nil)

// NewClock returns a fake clock set to start.
func NewClock(start time.Time) *Clock {
	return &Clock{now: start, changed: make(chan struct{})}
}

// Now returns the fake time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// NewTimer returns a timer that fires when the fake time reaches Now()+d.
// A timer with d <= 0 fires at once.
func (c *Clock) NewTimer(d time.Duration) runner.Timer {
	t := &timer{clk: c, ch: make(chan time.Time, 1)}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armLocked(t, d)
	return t
}

// Step moves the fake time forward by d and fires the timers that fall due.
func (c *Clock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setLocked(c.now.Add(d))
}

// Set moves the fake time to t (which must not be before Now) and fires the
// timers that fall due.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.Before(c.now) {
		panic(fmt.Sprintf("runnertest: Set(%v) goes back from %v", t, c.now))
	}
	c.setLocked(t)
}

// Armed returns the deadlines of the armed timers, earliest first.
func (c *Clock) Armed() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]time.Time, 0, len(c.timers))
	for _, t := range c.timers {
		out = append(out, t.deadline)
	}
	slices.SortFunc(out, time.Time.Compare)
	return out
}

// WaitArmed blocks until a timer is armed for exactly deadline, or ctx ends.
// Tests use it to know that the code under test has reached the point where
// it waits for that deadline.
func (c *Clock) WaitArmed(ctx context.Context, deadline time.Time) error {
	for {
		c.mu.Lock()
		found := slices.ContainsFunc(c.timers, func(t *timer) bool { return t.deadline.Equal(deadline) })
		changed := c.changed
		now := c.now
		c.mu.Unlock()
		if found {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("runnertest: no timer armed for %v (now %v, armed %v): %w", deadline, now, c.Armed(), ctx.Err())
		}
	}
}

func (c *Clock) setLocked(t time.Time) {
	c.now = t
	slices.SortStableFunc(c.timers, func(a, b *timer) int { return a.deadline.Compare(b.deadline) })
	kept := c.timers[:0]
	fired := false
	for _, tm := range c.timers {
		if tm.deadline.After(c.now) {
			kept = append(kept, tm)
			continue
		}
		tm.armed = false
		fired = true
		select {
		case tm.ch <- tm.deadline:
		default: // an earlier value is still unread; like time.Timer, keep one
		}
	}
	clear(c.timers[len(kept):])
	c.timers = kept
	if fired {
		c.notifyLocked()
	}
}

func (c *Clock) armLocked(t *timer, d time.Duration) {
	t.deadline = c.now.Add(d)
	if d <= 0 {
		t.armed = false
		select {
		case t.ch <- t.deadline:
		default:
		}
		c.notifyLocked()
		return
	}
	if !t.armed {
		t.armed = true
		c.timers = append(c.timers, t)
	}
	c.notifyLocked()
}

// disarmLocked removes t and drops any unread value, as time.Timer does
// since Go 1.23. It reports whether t was armed.
func (c *Clock) disarmLocked(t *timer) bool {
	was := t.armed
	if was {
		t.armed = false
		c.timers = slices.DeleteFunc(c.timers, func(x *timer) bool { return x == t })
	}
	select {
	case <-t.ch:
	default:
	}
	c.notifyLocked()
	return was
}

func (c *Clock) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

type timer struct {
	clk      *Clock
	ch       chan time.Time
	deadline time.Time
	armed    bool
}

func (t *timer) C() <-chan time.Time { return t.ch }

func (t *timer) Stop() bool {
	t.clk.mu.Lock()
	defer t.clk.mu.Unlock()
	return t.clk.disarmLocked(t)
}

func (t *timer) Reset(d time.Duration) bool {
	t.clk.mu.Lock()
	defer t.clk.mu.Unlock()
	was := t.clk.disarmLocked(t)
	t.clk.armLocked(t, d)
	return was
}
