package bench

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/test/agenttest"
	"github.com/edgeproxy/edgeproxy/test/cluster"
)

// TestHarness runs the whole benchmark, small: kube-proxy in both modes,
// edgeproxy in both modes and the Wasm chain against the real API server on the nft
// backend, S0 with a short window first, so that the harness that makes
// the published numbers is itself tested. It checks that each measurement
// is taken (not how fast anything is).
func TestHarness(t *testing.T) {
	gate.Root(t)
	gate.Binaries(t, "iptables-nft-restore", "iptables-legacy", "nft", "ip")
	kp, err := cluster.BinPath("kube-proxy")
	if err != nil {
		gate.Skip(t, err.Error())
	}
	root, _ := filepath.Abs(filepath.Join("..", ".."))
	module := filepath.Join(root, "bin", "modules", "topology.wasm")
	if _, err := os.Stat(module); err != nil {
		gate.Skip(t, "the example modules are not built (make modules)")
	}
	bins := Binaries{EdgeProxy: agenttest.Binary(t), KubeProxy: kp, Module: module}

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	dir := t.TempDir()
	w, err := NewWorld(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	plan := Plan{Sizes: []int{30}, Endpoints: 4, Backends: []string{"nft"},
		Proxies:    []ProxyKind{KubeProxy, KubeProxyNFT, EdgeProxy, EdgeProxyWasm, EdgeProxyNFT},
		S0Services: 10, S0Window: 1500 * time.Millisecond,
		Flips: 3, ChurnRates: []int{20}, ChurnFor: 2 * time.Second,
		Settings: Settings{MinSync: 200 * time.Millisecond, Sync: 2 * time.Second, ClusterCIDR: "10.244.0.0/16"},
		Timeout:  2 * time.Minute, Settle: time.Second}
	r := &Runner{World: w, Bins: bins, Plan: plan, Dir: dir, Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))}
	results, err := r.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 10 {
		t.Fatalf("%d results, want 10 (S0 and S1–S6 for 5 proxies)", len(results))
	}
	for _, res := range results {
		if res.Error != "" {
			t.Errorf("%s %s: %s", res.Scenario, res.Proxy, res.Error)
			continue
		}
		if res.Scenario == "S0" {
			if i := res.Idle; i == nil || i.Window <= 0 || len(i.Trace) == 0 || i.Wakeups < 0 || res.SteadyRSS <= 0 || res.ColdStart <= 0 || res.Endpoints != 3 {
				t.Errorf("%s: S0 not measured: %+v %+v", res.Proxy, res, res.Idle)
			}
			continue
		}
		if res.ColdStart <= 0 || res.ColdCPU <= 0 || res.ColdPeakRSS <= 0 {
			t.Errorf("%s: S1 not measured: %+v", res.Proxy, res)
		}
		if len(res.Flips) != plan.Flips {
			t.Errorf("%s: %d flips measured, want %d", res.Proxy, len(res.Flips), plan.Flips)
		}
		if len(res.FlipDelivered) != len(res.Flips) || slices.ContainsFunc(res.FlipDelivered, func(d float64) bool { return d <= 0 }) {
			t.Errorf("%s: the API server's share of each flip not measured: %v", res.Proxy, res.FlipDelivered)
		}
		if res.FloorRestore <= 0 || res.FloorOneChange <= 0 || res.RuleSetBytes <= 0 {
			t.Errorf("%s: floor not measured: %+v", res.Proxy, res)
		}
		if !res.Proxy.nftables() && res.FloorNoflush <= 0 {
			t.Errorf("%s: floor with --noflush not measured", res.Proxy)
		}
		if res.SteadyRSS <= 0 || res.Goroutines <= 0 || res.HeapAlloc <= 0 {
			t.Errorf("%s: footprint not measured: rss %d goroutines %v heap %v", res.Proxy, res.SteadyRSS, res.Goroutines, res.HeapAlloc)
		}
		if res.KernelWrites < 0 {
			t.Errorf("%s: kernel writes not counted on nft", res.Proxy)
		}
		if len(res.FlipWrites) != len(res.Flips) || slices.ContainsFunc(res.FlipWrites, func(w Written) bool { return w.Transactions == 0 || w.Bytes <= 0 }) {
			t.Errorf("%s: what each flip wrote not counted: %+v", res.Proxy, res.FlipWrites)
		}
		if res.Proxy != EdgeProxyWasm && (len(res.Churn) != 1 || res.Churn[0].Updates == 0) {
			t.Errorf("%s: churn not measured: %+v", res.Proxy, res.Churn)
		}
	}
	// edgeproxy writes nothing to the kernel when nothing changed (S4).
	if e := find(results, EdgeProxy, "nft", 30); e != nil && e.KernelWrites != 0 {
		t.Errorf("edgeproxy wrote %d times to nf_tables in a quiet window", e.KernelWrites)
	}
	rep := &Report{Date: time.Now(), Plan: plan, Results: results, Command: "test"}
	out := filepath.Join(dir, "report")
	if err := rep.WriteFiles(out); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"report.md", "results.json", "latency-cdf-nft.png", "cold-start-nft.png", "rss-nft.png", "s0-cpu-nft.png", "s0-wakeups-nft.png", "s0-rss-nft.png"} {
		if fi, err := os.Stat(filepath.Join(out, f)); err != nil || fi.Size() == 0 {
			t.Errorf("report file %s: %v", f, err)
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("report.md:\n%s", md)
	for _, want := range []string{"## S0 edge scale", "against kube-proxy-nftables", "| 30 | kube-proxy-nftables |",
		"### edgeproxy `mode: nftables`", "| 30 | edgeproxy-nftables |", "#### What one change writes to nf_tables"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report.md lacks %q", want)
		}
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }
