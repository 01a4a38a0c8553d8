package proxies

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Metrics is one read of a proxy's /metrics: each sample's name with its
// labels, as the proxy wrote them, to its value. Both proxies serve the
// Prometheus text format without timestamps.
type Metrics map[string]float64

// ParseMetrics reads a Prometheus text exposition. A sample line whose
// value does not parse is an error: a harness that judged on a half-read
// scrape would judge on nothing.
func ParseMetrics(r io.Reader) (Metrics, error) {
	m := Metrics{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			return nil, fmt.Errorf("metrics: no value in %q", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64) // "+Inf" and "NaN" parse
		if err != nil {
			return nil, fmt.Errorf("metrics: %q: %w", line, err)
		}
		m[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return m, nil
}

// Select is the samples whose name (before any label) is name and whose
// labels contain every one of labels, each written as in the text
// (`ip_family="IPv4"`).
func (m Metrics) Select(name string, labels ...string) Metrics {
	out := Metrics{}
	for k, v := range m {
		n, rest, _ := strings.Cut(k, "{")
		if n != name {
			continue
		}
		if !slices.ContainsFunc(labels, func(l string) bool { return !strings.Contains(rest, l) }) {
			out[k] = v
		}
	}
	return out
}

// Sum adds the samples Select picks; 0 when there are none.
func (m Metrics) Sum(name string, labels ...string) float64 {
	var s float64
	for _, v := range m.Select(name, labels...) {
		s += v
	}
	return s
}

// Bucket is one cumulative bucket of a histogram: N samples at most Le.
type Bucket struct{ Le, N float64 }

// Buckets is histogram name's buckets whose labels contain labels, in the
// order of their bounds; label sets with the same bound (IPv4 and IPv6)
// are added up. A bucket whose bound does not parse is left out.
func (m Metrics) Buckets(name string, labels ...string) []Bucket {
	var bs []Bucket
	for k, v := range m.Select(name+"_bucket", labels...) {
		_, le, ok := strings.Cut(k, `le="`)
		if !ok {
			continue
		}
		le, _, _ = strings.Cut(le, `"`)
		b, err := strconv.ParseFloat(le, 64)
		if err != nil {
			continue
		}
		bs = append(bs, Bucket{b, v})
	}
	slices.SortFunc(bs, func(a, b Bucket) int { return cmp.Compare(a.Le, b.Le) })
	merged := bs[:0]
	for _, b := range bs {
		if n := len(merged); n > 0 && merged[n-1].Le == b.Le {
			merged[n-1].N += b.N
			continue
		}
		merged = append(merged, b)
	}
	return merged
}

// HistQuantile estimates quantile q of histogram name from its buckets (of
// the samples since before, when before is given) by linear interpolation
// inside the bucket, as Prometheus does. NaN without samples.
func HistQuantile(after, before Metrics, name string, q float64) float64 {
	bs := after.Buckets(name)
	if before != nil {
		earlier := before.Buckets(name)
		for i := range bs {
			if j, ok := slices.BinarySearchFunc(earlier, bs[i].Le, func(b Bucket, le float64) int { return cmp.Compare(b.Le, le) }); ok {
				bs[i].N -= earlier[j].N
			}
		}
	}
	if len(bs) == 0 || bs[len(bs)-1].N <= 0 {
		return math.NaN()
	}
	rank := q * bs[len(bs)-1].N
	prevLe, prevN := 0.0, 0.0
	for _, b := range bs {
		if b.N >= rank {
			if math.IsInf(b.Le, 1) {
				return prevLe
			}
			if b.N == prevN {
				return b.Le
			}
			return prevLe + (b.Le-prevLe)*(rank-prevN)/(b.N-prevN)
		}
		prevLe, prevN = b.Le, b.N
	}
	return prevLe
}
