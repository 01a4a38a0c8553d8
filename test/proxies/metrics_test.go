package proxies

import (
	"math"
	"strings"
	"testing"
)

// ParseMetrics keeps each sample under its name and labels as written,
// skips comments, and refuses a value that does not parse.
func TestParseMetrics(t *testing.T) {
	const text = `# HELP go_goroutines Number of goroutines that currently exist.
# TYPE go_goroutines gauge
go_goroutines 12
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7640271e+09
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 0
x_bucket{le="+Inf"} 3
`
	m, err := ParseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	want := Metrics{
		"go_goroutines": 12,
		`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}`: 1.7640271e+09,
		`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"}`: 0,
		`x_bucket{le="+Inf"}`: 3,
	}
	if len(m) != len(want) {
		t.Errorf("ParseMetrics = %v, want %v", m, want)
	}
	for k, v := range want {
		if got, ok := m[k]; !ok || got != v {
			t.Errorf("%s = %v (%t), want %v", k, got, ok, v)
		}
	}
	for _, bad := range []string{"go_goroutines twelve\n", "go_goroutines\n"} {
		if m, err := ParseMetrics(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseMetrics(%q) = %v, want an error", bad, m)
		}
	}
}

// Sum adds the samples of one name whose labels hold every label asked
// for, and no sample of a longer name that starts with it.
func TestSum(t *testing.T) {
	m := Metrics{
		`x_count{ip_family="IPv4"}`: 4,
		`x_count{ip_family="IPv6"}`: 2,
		`x_count_total`:             100,
		`x_sum{ip_family="IPv4"}`:   9,
	}
	for _, c := range []struct {
		labels []string
		want   float64
	}{
		{nil, 6},
		{[]string{`ip_family="IPv4"`}, 4},
		{[]string{`ip_family="IPv4"`, `le="1"`}, 0},
	} {
		if got := m.Sum("x_count", c.labels...); got != c.want {
			t.Errorf("Sum(x_count, %q) = %v, want %v", c.labels, got, c.want)
		}
	}
	if got := len(m.Select("x")); got != 0 {
		t.Errorf("Select(x) picked %d samples of other names", got)
	}
}

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
	if got, want := HistQuantile(after, nil, h, 0.5), 0.1*12.5/15; math.Abs(got-want) > 1e-9 {
		t.Errorf("since the start: q0.50 = %v, want %v", got, want)
	}
}
