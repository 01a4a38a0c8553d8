package prober

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// script is a dial whose answer per address the test sets.
type script struct {
	mu   sync.Mutex
	down map[Target]bool
}

func (s *script) set(a Target, down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down[a] = down
}

func (s *script) dial(_ context.Context, a Target) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down[a] {
		return errors.New("connection refused")
	}
	return nil
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
	}
}

func run(t *testing.T, p *Prober) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

var (
	epA = Target{Addr: netip.MustParseAddrPort("10.0.0.1:80")}
	epB = Target{Addr: netip.MustParseAddrPort("10.0.0.2:80")}
)

// An endpoint is Failed after failureThreshold failures in a row, with a
// reason, and Healthy again after successThreshold passes; Reset drops
// every verdict.
func TestThresholds(t *testing.T) {
	s := &script{down: map[Target]bool{epA: true}}
	p := New(Options{Interval: 5 * time.Millisecond, FailureThreshold: 3, SuccessThreshold: 2, RatePerSecond: 1000, Dial: s.dial})
	p.SetTargets([]Target{epA, epB})
	run(t, p)
	eventually(t, "a failed, b healthy", func() bool {
		return p.Verdict(epA).State == Failed && p.Verdict(epB).State == Healthy
	})
	if v := p.Verdict(epA); v.Failures < 3 || v.Reason() == "" {
		t.Errorf("failed verdict %+v, reason %q", v, v.Reason())
	}
	s.set(epA, false)
	eventually(t, "a healthy again", func() bool { return p.Verdict(epA).State == Healthy })
	if c := p.Counts(); c[Healthy] != 2 || c[Failed] != 0 {
		t.Errorf("counts %v", c)
	}
	s.set(epA, true)
	eventually(t, "a failed again", func() bool { return p.Verdict(epA).State == Failed })
	p.Reset()
	if v := p.Verdict(epA); v.State != Unknown || v.Failures != 0 {
		t.Errorf("after Reset: %+v", v)
	}
	p.SetTargets([]Target{epB})
	if c := p.Counts(); c[Unknown]+c[Healthy]+c[Failed] != 1 {
		t.Errorf("a dropped target is still counted: %v", c)
	}
}

// Real TCP connects on loopback: a listening port passes, a closed one
// fails.
func TestDialTCP(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	up := Target{Addr: netip.MustParseAddrPort(l.Addr().String())}
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := Target{Addr: netip.MustParseAddrPort(closed.Addr().String())}
	closed.Close()
	p := New(Options{Interval: 5 * time.Millisecond, FailureThreshold: 2, Timeout: 500 * time.Millisecond})
	p.SetTargets([]Target{up, down})
	run(t, p)
	eventually(t, "listening port healthy, closed port failed", func() bool {
		return p.Verdict(up).State == Healthy && p.Verdict(down).State == Failed
	})
}

// A UDP probe fails only on evidence that the server is gone (an ICMP
// port unreachable for a closed port); an answer or silence passes.
func TestDialUDP(t *testing.T) {
	echo, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		buf := make([]byte, 64)
		for {
			n, from, err := echo.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = echo.WriteTo(buf[:n], from)
		}
	}()
	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	closed, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := netip.MustParseAddrPort(closed.LocalAddr().String())
	closed.Close()
	for _, tc := range []struct {
		what string
		addr netip.AddrPort
		fail bool
	}{
		{"answering", netip.MustParseAddrPort(echo.LocalAddr().String()), false},
		{"silent", netip.MustParseAddrPort(silent.LocalAddr().String()), false},
		{"closed", gone, true},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		err := Dial(ctx, Target{Addr: tc.addr, UDP: true})
		cancel()
		if (err != nil) != tc.fail {
			t.Errorf("%s UDP port: probe error %v, want failure %v", tc.what, err, tc.fail)
		}
	}
}

func TestKeepNeverBlackholes(t *testing.T) {
	for _, tc := range []struct {
		failed, want []bool
	}{
		{[]bool{false, true, false}, []bool{true, false, true}},
		{[]bool{true, true, true}, []bool{true, true, true}},
		{[]bool{}, []bool{}},
	} {
		got := Keep(tc.failed)
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("Keep(%v) = %v, want %v", tc.failed, got, tc.want)
				break
			}
		}
	}
}

// counting dials slowly and records the most probes in flight at once.
type counting struct {
	inFlight, most atomic.Int64
}

func (c *counting) dial(ctx context.Context, _ Target) error {
	n := c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
	for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
	}
	select {
	case <-ctx.Done():
	case <-time.After(20 * time.Millisecond):
	}
	return nil
}

func thousand() []Target {
	out := make([]Target, 1000)
	for i := range out {
		out[i] = Target{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 80)}
	}
	return out
}

// With 1,000 endpoints all due at once (interval 1ms asks for a million
// probes a second), the prober starts no more than its rate cap allows
// and keeps no more than its concurrency cap in flight.
func TestRateAndConcurrencyCaps(t *testing.T) {
	c := &counting{}
	p := New(Options{Interval: time.Millisecond, RatePerSecond: 200, Concurrency: 3, Dial: c.dial})
	p.SetTargets(thousand())
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	p.Run(ctx)
	elapsed := time.Since(start)
	if max := int64(elapsed.Seconds()*200) + 1; p.Probes() > max {
		t.Errorf("%d probes in %s: over the cap of 200/s (%d)", p.Probes(), elapsed, max)
	}
	if p.Probes() == 0 {
		t.Error("no probes at all")
	}
	if m := c.most.Load(); m > 3 {
		t.Errorf("%d probes in flight at once, cap 3", m)
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkProber1000 runs the prober over 1,000 endpoints for one second
// per iteration at the default caps, dialing nothing, and reports the
// probes started per second and the CPU the process used per wall second.
func BenchmarkProber1000(b *testing.B) {
	s := &script{down: map[Target]bool{}}
	var probes int64
	var wall, cpu time.Duration
	for b.Loop() {
		p := New(Options{Interval: 100 * time.Millisecond, Dial: s.dial})
		p.SetTargets(thousand())
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c0, w0 := cpuTime(), time.Now()
		p.Run(ctx)
		cancel()
		cpu += cpuTime() - c0
		wall += time.Since(w0)
		probes += p.Probes()
	}
	b.ReportMetric(float64(probes)/wall.Seconds(), "probes/s")
	b.ReportMetric(cpu.Seconds()/wall.Seconds(), "cpu-cores")
}
