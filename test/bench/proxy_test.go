package bench

import (
	"math"
	"testing"
)

// HistQuantile interpolates inside the bucket, adds label sets with the
// same bound, and takes the difference between two scrapes.
func TestHistQuantile(t *testing.T) {
	h := "x_seconds"
	before := Metrics{
		h + `_bucket{ip_family="IPv4",le="0.1"}`:  5,
		h + `_bucket{ip_family="IPv4",le="1"}`:    5,
		h + `_bucket{ip_family="IPv4",le="+Inf"}`: 5,
	}
	after := Metrics{
		h + `_bucket{ip_family="IPv4",le="0.1"}`:  15, // 10 new in (0, 0.1]
		h + `_bucket{ip_family="IPv4",le="1"}`:    25, // 10 new in (0.1, 1]
		h + `_bucket{ip_family="IPv4",le="+Inf"}`: 25,
		h + `_bucket{ip_family="IPv6",le="0.1"}`:  0,
		h + `_bucket{ip_family="IPv6",le="1"}`:    0,
		h + `_bucket{ip_family="IPv6",le="+Inf"}`: 0,
	}
	for _, c := range []struct{ q, want float64 }{{0.25, 0.05}, {0.5, 0.1}, {0.75, 0.55}} {
		if got := HistQuantile(after, before, h, c.q); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("q%.2f = %v, want %v", c.q, got, c.want)
		}
	}
	if got := HistQuantile(before, before, h, 0.5); !math.IsNaN(got) {
		t.Errorf("no new samples: %v, want NaN", got)
	}
}
