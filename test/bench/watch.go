package bench

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Watcher polls the kernel for DNAT destinations. With nf_tables it reads
// the ruleset generation every millisecond and dumps the rules only when it
// changed, stamping what it finds with the moment the new generation was
// first seen. x_tables has no generation: it reads the whole table each
// time, pausing as long as a read takes, so that it never uses more than
// half a core; what it finds is stamped with the read's start.
type Watcher struct {
	k       Kernel
	gen     uint64
	scanned bool
	costs   []time.Duration // of each scan, to report the resolution
}

// NewWatcher wraps a kernel reader.
func NewWatcher(k Kernel) *Watcher { return &Watcher{k: k} }

// Poll waits for the next kernel state worth reading and calls fn with
// every destination in it; seen is when that state was first observed.
func (w *Watcher) Poll(ctx context.Context, fn func(Dest)) (seen time.Time, err error) {
	for {
		seen = time.Now()
		g, err := w.k.Generation()
		if err != nil {
			return seen, err
		}
		if !w.scanned || g != w.gen {
			w.gen, w.scanned = g, true
			break
		}
		select {
		case <-ctx.Done():
			return seen, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	start := time.Now()
	if err := w.k.Scan(fn); err != nil {
		return seen, err
	}
	cost := time.Since(start)
	w.costs = append(w.costs, cost)
	if _, ok := w.k.(*legacyKernel); ok {
		select {
		case <-ctx.Done():
			return seen, ctx.Err()
		case <-time.After(max(2*time.Millisecond, cost)):
		}
		seen = start
	}
	return seen, nil
}

// Resolution is the median cost of one kernel read so far.
func (w *Watcher) Resolution() time.Duration {
	if len(w.costs) == 0 {
		return 0
	}
	c := slices.Clone(w.costs)
	slices.Sort(c)
	return c[len(c)/2]
}

// WaitAll waits until every destination in want is in the kernel and
// returns when that was first seen, with how many were present at the end.
func (w *Watcher) WaitAll(ctx context.Context, want map[Dest]struct{}, timeout time.Duration, alive func() error) (time.Time, int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	found := 0
	for {
		n := 0
		seen, err := w.Poll(ctx, func(d Dest) {
			if _, ok := want[d]; ok {
				n++
			}
		})
		if err != nil {
			return seen, found, fmt.Errorf("bench: %d of %d endpoints programmed: %w", found, len(want), err)
		}
		found = n
		if found >= len(want) {
			return seen, found, nil
		}
		if alive != nil {
			if err := alive(); err != nil {
				return seen, found, err
			}
		}
	}
}

// WaitFlip waits until added is in the kernel and removed is not.
func (w *Watcher) WaitFlip(ctx context.Context, added, removed Dest, timeout time.Duration) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		var in, out bool
		seen, err := w.Poll(ctx, func(d Dest) {
			switch d {
			case added:
				in = true
			case removed:
				out = true
			}
		})
		if err != nil {
			return seen, fmt.Errorf("bench: waiting for %s to replace %s: %w", added, removed, err)
		}
		if in && !out {
			return seen, nil
		}
	}
}
