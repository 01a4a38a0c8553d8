package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/nftables"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// The benchmarks here break issue 27's S1 (cold start) and S2 (one
// change) down into the agent's own share and the datapath's: the sync
// (snapshot, plan, sanitize, apply, what follows) over a state of n
// service ports × 10 endpoints, with a backend that does nothing ("nop")
// or with mode nftables in a throwaway network namespace ("nft"), whose
// Apply is timed on its own (apply-ms). The source (list, watch,
// conversion) and process start come on top.

// nopBackend programs nothing: what a sync costs without its kernel.
type nopBackend struct{}

func (nopBackend) Name() string                                { return "nop" }
func (nopBackend) Apply(context.Context, *datapath.Plan) error { return nil }
func (nopBackend) Cleanup(context.Context) error               { return nil }

// timedBackend adds up the time its backend's applies take.
type timedBackend struct {
	datapath.Backend
	took time.Duration
}

func (t *timedBackend) Apply(ctx context.Context, p *datapath.Plan) error {
	start := time.Now()
	err := t.Backend.Apply(ctx, p)
	t.took += time.Since(start)
	return err
}

// benchAgent returns an agent (plan config, not running) over fill(n)
// that programs backend.
func benchAgent(b *testing.B, n int, backend datapath.Backend) *Agent {
	cfg := config.Default()
	cfg.NodeName, cfg.Manifests, cfg.Mode, cfg.StateDir = "n1", b.TempDir(), "plan", b.TempDir()
	cfg.Server = config.Server{}
	a, err := New(Options{Config: &cfg, Backend: backend, Registry: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	a.state = fill(n)
	return a
}

// nftBackend is mode nftables in a new network namespace.
func nftBackend(b *testing.B) *timedBackend {
	gate.Root(b)
	ns := netns.New(b, "syncpath")
	p, err := nftables.New(nftables.Options{MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		NetNS: int(ns.Handle()), NoConntrack: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = p.Close() })
	return &timedBackend{Backend: p}
}

func cpuNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSyncOne: one slice's endpoints replaced, then one sync (S2).
// p50-ms is wall time; cpu-ns/op counts every goroutine's CPU (the garbage
// collector's too), the steadier number on a shared machine.
func BenchmarkSyncOne(b *testing.B) {
	for _, backend := range []string{"nop", "nft"} {
		for _, n := range []int{5000, 10000} {
			b.Run(fmt.Sprintf("%s/services=%d", backend, n), func(b *testing.B) {
				var tb *timedBackend
				if backend == "nft" {
					tb = nftBackend(b)
				} else {
					tb = &timedBackend{Backend: nopBackend{}}
				}
				a := benchAgent(b, n, tb)
				ctx := context.Background()
				if err := a.sync(ctx); err != nil {
					b.Fatal(err)
				}
				a.snaps.wait()
				tb.took = 0
				name := fmt.Sprint("svc-", n/2)
				k := 0
				var took []time.Duration
				cpu0 := cpuNow()
				for b.Loop() {
					k++
					sl := &model.EndpointSlice{Namespace: "shop", Name: name + "-1", Service: name, Family: model.IPv4,
						Ports: []model.EndpointPort{{Name: "http", Protocol: "TCP", Port: 8080}}}
					for j := range 10 {
						sl.Endpoints = append(sl.Endpoints, model.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 250, byte(k), byte(j)}), Ready: true, Serving: true})
					}
					a.state.SetSlice("shop/"+name+"-1", sl)
					start := time.Now()
					if err := a.sync(ctx); err != nil {
						b.Fatal(err)
					}
					took = append(took, time.Since(start))
					if p := a.Last().Plan; len(p.Changed) != 1 || len(p.Frontends) != n {
						b.Fatalf("plan changed %d ports of %d frontends, want 1 of %d", len(p.Changed), len(p.Frontends), n)
					}
				}
				cpu := cpuNow() - cpu0
				a.snaps.wait()
				slices.Sort(took)
				b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
				b.ReportMetric(float64(tb.took.Microseconds())/1000/float64(b.N), "apply-ms")
				b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
			})
		}
	}
}

// BenchmarkSyncCold: the first sync of a new agent (S1 without the
// source's list): every port snapshot, planned, sanitized and applied.
func BenchmarkSyncCold(b *testing.B) {
	for _, backend := range []string{"nop", "nft"} {
		for _, n := range []int{1000, 5000} {
			b.Run(fmt.Sprintf("%s/services=%d", backend, n), func(b *testing.B) {
				var apply, cpu time.Duration
				for b.Loop() {
					b.StopTimer()
					var tb *timedBackend
					if backend == "nft" {
						tb = nftBackend(b) // a new namespace: an empty kernel
					} else {
						tb = &timedBackend{Backend: nopBackend{}}
					}
					a := benchAgent(b, n, tb)
					cpu0 := cpuNow()
					b.StartTimer()
					if err := a.sync(context.Background()); err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					cpu += cpuNow() - cpu0
					apply += tb.took
					if p := a.Last().Plan; len(p.Frontends) != n {
						b.Fatalf("plan of %d frontends, want %d", len(p.Frontends), n)
					}
					a.snaps.wait()
					b.StartTimer()
				}
				b.ReportMetric(float64(apply.Microseconds())/1000/float64(b.N), "apply-ms")
				b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
			})
		}
	}
}
