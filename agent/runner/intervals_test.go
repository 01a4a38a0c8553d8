package runner

import (
	"testing"
	"time"
)

func TestSetIntervals(t *testing.T) {
	h := newHarness(t, minI, retryI, maxI)
	h.r.Run()
	h.tick(1, maxI)

	// A shorter max interval counts from the end of the last run.
	h.r.SetIntervals(2*time.Second, 3*time.Second, 10*time.Second)
	h.tick(1, 10*time.Second)

	// The new min interval applies to the next request.
	h.at(time.Second)
	h.r.Run()
	h.tick(1, 2*time.Second)
	h.at(2 * time.Second)
	h.tick(2, 12*time.Second)

	// The new retry interval applies to the next failure.
	h.outcomes = []outcome{fail}
	h.at(4 * time.Second)
	h.r.Run()
	h.tick(3, 7*time.Second)

	// Zero max interval: no periodic runs; the pending retry stays.
	h.r.SetIntervals(2*time.Second, 3*time.Second, 0)
	h.tick(3, 7*time.Second)
	h.at(7 * time.Second)
	h.tick(4, 0)
}
