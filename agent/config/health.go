package config

import "time"

// validateHealth checks the health.* keys; bad reports one bad key.
func validateHealth(h Health, bad func(key, format string, args ...any)) {
	switch h.Mode {
	case HealthOffline, HealthAlways, HealthOff:
	default:
		bad("health.mode", "%q is not one of %q, %q, %q", h.Mode, HealthOffline, HealthAlways, HealthOff)
	}
	if h.After < 0 {
		bad("health.after", "%s is negative", h.After)
	}
	if h.Interval < 10*time.Millisecond {
		bad("health.interval", "%s is shorter than 10ms", h.Interval)
	}
	if h.Timeout <= 0 || h.Timeout > h.Interval {
		bad("health.timeout", "%s must be positive and at most health.interval (%s)", h.Timeout, h.Interval)
	}
	positive := func(key string, v, max int) {
		if v < 1 || v > max {
			bad(key, "%d is not in 1..%d", v, max)
		}
	}
	positive("health.failureThreshold", h.FailureThreshold, 100)
	positive("health.successThreshold", h.SuccessThreshold, 100)
	positive("health.probesPerSecond", h.ProbesPerSecond, 10000)
	positive("health.concurrency", h.Concurrency, 1024)
	if h.JitterPercent < 0 || h.JitterPercent > 100 {
		bad("health.jitterPercent", "%d is not in 0..100", h.JitterPercent)
	}
}
