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
)

// nopBackend programs nothing: what a sync costs without its kernel.
type nopBackend struct{}

func (nopBackend) Name() string                                { return "nop" }
func (nopBackend) Apply(context.Context, *datapath.Plan) error { return nil }
func (nopBackend) Cleanup(context.Context) error               { return nil }

// BenchmarkSyncOne is the agent's own share of one Service change (issue
// 27's S2) at 5,000 and 10,000 service ports × 10 endpoints: one slice's
// endpoints replaced, then one sync (snapshot, plan, sanitize, apply to a
// backend that does nothing, metrics, the snapshot write's start). p50-ms
// is wall time; cpu-ns/op counts every goroutine's CPU (the garbage
// collector's too), the steadier number on a shared machine.
func BenchmarkSyncOne(b *testing.B) {
	for _, n := range []int{5000, 10000} {
		b.Run(fmt.Sprint("services=", n), func(b *testing.B) {
			cfg := config.Default()
			cfg.NodeName, cfg.Manifests, cfg.Mode, cfg.StateDir = "n1", b.TempDir(), "plan", b.TempDir()
			cfg.Server = config.Server{}
			a, err := New(Options{Config: &cfg, Backend: nopBackend{}, Registry: prometheus.NewRegistry(),
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				b.Fatal(err)
			}
			a.state = fill(n)
			ctx := context.Background()
			if err := a.sync(ctx); err != nil {
				b.Fatal(err)
			}
			a.snaps.wait()
			name := fmt.Sprint("svc-", n/2)
			k := 0
			var took []time.Duration
			var ru0, ru syscall.Rusage
			syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
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
			syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
			a.snaps.wait()
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
			cpu := ru.Utime.Nano() + ru.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano()
			b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}
