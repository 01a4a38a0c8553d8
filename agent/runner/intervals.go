package runner

import "time"

// SetIntervals changes the intervals of a running runner (config reload).
// They are normalised as in New. The max-interval deadline already set is
// moved to the new max measured from the last run (or from now if none).
func (r *Runner) SetIntervals(minInterval, retryInterval, maxInterval time.Duration) {
	minInterval = max(minInterval, 0)
	if retryInterval <= 0 {
		retryInterval = minInterval
	}
	maxInterval = max(maxInterval, 0)
	if maxInterval > 0 && maxInterval < minInterval {
		maxInterval = minInterval
	}
	r.mu.Lock()
	r.min, r.retry, r.max = minInterval, retryInterval, maxInterval
	switch {
	case maxInterval == 0:
		r.maxAt = time.Time{}
	case r.looping:
		from := r.lastEnd
		if from.IsZero() {
			from = r.clk.Now()
		}
		r.maxAt = from.Add(maxInterval)
	}
	r.mu.Unlock()
	// Wake the loop so it recomputes when the next run is due; a wake-up
	// is not a request, so nothing runs early.
	select {
	case r.wake <- struct{}{}:
	default:
	}
}
