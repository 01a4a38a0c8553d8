package config

import (
	"strings"
	"testing"
	"time"
)

// Each bad health.* value is refused with its key named.
func TestValidateHealth(t *testing.T) {
	for key, mutate := range map[string]func(*Health){
		"health.mode":             func(h *Health) { h.Mode = "sometimes" },
		"health.after":            func(h *Health) { h.After = -time.Second },
		"health.interval":         func(h *Health) { h.Interval, h.Timeout = time.Millisecond, time.Millisecond },
		"health.timeout":          func(h *Health) { h.Timeout = time.Minute },
		"health.failureThreshold": func(h *Health) { h.FailureThreshold = 0 },
		"health.successThreshold": func(h *Health) { h.SuccessThreshold = 101 },
		"health.probesPerSecond":  func(h *Health) { h.ProbesPerSecond = 0 },
		"health.concurrency":      func(h *Health) { h.Concurrency = -1 },
		"health.jitterPercent":    func(h *Health) { h.JitterPercent = 150 },
	} {
		h := Default().Health
		var got []string
		validateHealth(h, func(k, _ string, _ ...any) { got = append(got, k) })
		if len(got) != 0 {
			t.Fatalf("defaults refused: %v", got)
		}
		mutate(&h)
		validateHealth(h, func(k, _ string, _ ...any) { got = append(got, k) })
		if strings.Join(got, ",") != key {
			t.Errorf("%s: refused %v", key, got)
		}
	}
}
