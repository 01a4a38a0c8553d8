package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/state"
	"github.com/edgeproxy/edgeproxy/datapath"
)

// flaky is a datapath that fails while told to and records what it got.
type flaky struct {
	mu    sync.Mutex
	fail  bool
	plans []*datapath.Plan
}

func (f *flaky) Name() string { return "flaky" }
func (f *flaky) Apply(_ context.Context, p *datapath.Plan) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.plans = append(f.plans, p)
	if f.fail {
		return errors.New("injected failure")
	}
	return nil
}
func (f *flaky) Cleanup(context.Context) error { return nil }
func (f *flaky) setFail(v bool)                { f.mu.Lock(); f.fail = v; f.mu.Unlock() }
func (f *flaky) got() []*datapath.Plan {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*datapath.Plan(nil), f.plans...)
}

const webManifest = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: t}
spec: {clusterIP: 10.96.0.5, ports: [{port: 80}]}
`

func startAgent(t *testing.T, backend datapath.Backend, manifests string) *Agent {
	t.Helper()
	return startAgentWith(t, planConfig(t, manifests), Options{Backend: backend})
}

// planConfig is the config of the agents these tests start: plan mode on
// node n1 reading manifests, no servers, a sync at most every 10ms (and a
// full one hourly).
func planConfig(t *testing.T, manifests string) config.Config {
	cfg := config.Default()
	cfg.NodeName, cfg.Manifests, cfg.Mode = "n1", manifests, "plan"
	cfg.StateDir = t.TempDir()
	cfg.Server = config.Server{}
	cfg.Sync = config.Sync{MinPeriod: 10 * time.Millisecond, Period: time.Hour, HealthTimeout: 300 * time.Millisecond}
	return cfg
}

// startAgentWith starts an agent on cfg with opts (its registry and a
// silent logger filled in) that runs until t ends; Run must then return
// nil.
func startAgentWith(t *testing.T, cfg config.Config, opts Options) *Agent {
	t.Helper()
	opts.Config, opts.Registry = &cfg, prometheus.NewRegistry()
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return a
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A change that cannot be programmed makes /healthz fail once it has waited
// longer than the health timeout; programming it makes it pass again. A
// failed apply makes the next plan a full one.
func TestHealthFollowsPendingChanges(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(webManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	b := &flaky{}
	a := startAgent(t, b, dir)
	<-a.Synced()
	if h := a.HealthNow(time.Now()); !h.Healthy {
		t.Fatalf("unhealthy after the first sync: %+v", h)
	}

	b.setFail(true)
	n := len(b.got())
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(webManifest+"  type: ClusterIP\n  externalIPs: [192.0.2.9]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a failed apply", func() bool { return len(b.got()) > n })
	eventually(t, "unhealthy", func() bool { return !a.HealthNow(time.Now()).Healthy })
	if h := a.HealthNow(time.Now()); h.LastError == "" || h.PendingSince.IsZero() {
		t.Errorf("unhealthy answer lacks the why: %+v", h)
	}

	b.setFail(false)
	eventually(t, "healthy again", func() bool { return a.HealthNow(time.Now()).Healthy })
	plans := b.got()
	var sawFail, fullAfter bool
	for _, p := range plans[n:] {
		if !sawFail {
			sawFail = true
			continue
		}
		fullAfter = fullAfter || p.Full
	}
	if !fullAfter {
		t.Errorf("no full plan after a failed apply")
	}
}

// Nothing programmed yet: healthy at first, unhealthy once the first sync
// is overdue (kube-proxy's meaning for a proxy that never got going).
func TestHealthBeforeFirstSync(t *testing.T) {
	b := &flaky{fail: true}
	a := startAgent(t, b, t.TempDir())
	eventually(t, "unhealthy without a first sync", func() bool { return !a.HealthNow(time.Now()).Healthy })
}

// A Node on its way out (tainted by the cluster autoscaler, or deleted)
// fails /healthz so that load balancers drain it; /livez stays 200 and the
// proxy itself stays healthy (kube-proxy's proxier_health.go).
func TestHealthzFailsForIneligibleNode(t *testing.T) {
	dir := t.TempDir()
	node := "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n"
	if err := os.WriteFile(filepath.Join(dir, "node.yaml"), []byte(node), 0o644); err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, &flaky{}, dir)
	<-a.Synced()
	code := func(h http.HandlerFunc) int {
		rec := httptest.NewRecorder()
		h(rec, httptest.NewRequest("GET", "/", nil))
		return rec.Code
	}
	if c := code(a.serveHealthz); c != 200 {
		t.Fatalf("/healthz = %d before the taint, want 200", c)
	}
	tainted := node + "spec:\n  taints: [{key: ToBeDeletedByClusterAutoscaler, effect: NoSchedule}]\n"
	if err := os.WriteFile(filepath.Join(dir, "node.yaml"), []byte(tainted), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "/healthz 503 for a node being removed", func() bool { return code(a.serveHealthz) == 503 })
	if c := code(a.serveLivez); c != 200 {
		t.Errorf("/livez = %d for a node being removed, want 200", c)
	}
	if h := a.HealthNow(time.Now()); !h.Healthy || h.NodeEligible {
		t.Errorf("health = %+v, want healthy and not eligible", h)
	}
}

// ExternalIPs are opt-in; a Service that has them while they are off is
// warned about once, counted, and named in the status.
func TestExternalIPsIgnoredWarnedOnce(t *testing.T) {
	dir := t.TempDir()
	svc := "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: t}\n" +
		"spec: {clusterIP: 10.96.0.5, externalIPs: [192.0.2.9], ports: [{port: 80}]}\n"
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(svc), 0o644); err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, &flaky{}, dir)
	<-a.Synced()
	if got := a.Last().ExternalIPsIgnored; len(got) != 1 || got[0] != "t/web" {
		t.Fatalf("ExternalIPsIgnored = %v, want [t/web]", got)
	}
	counter := func() float64 {
		mfs, err := a.opts.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "edgeproxy_external_ips_ignored_total" {
				return mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return -1
	}
	if c := counter(); c != 1 {
		t.Fatalf("edgeproxy_external_ips_ignored_total = %v, want 1", c)
	}
	// Another sync that plans again (a quiet one is idle): as after a
	// tamper repair.
	gen := a.Last().Plan.Generation
	a.mu.Lock()
	a.needFull = true
	a.mu.Unlock()
	eventually(t, "another sync", func() bool { a.runner.Run(); return a.Last().Plan.Generation > gen })
	if c := counter(); c != 1 {
		t.Fatalf("edgeproxy_external_ips_ignored_total = %v after another sync, want still 1", c)
	}
	rec := httptest.NewRecorder()
	a.serveStatus(rec, httptest.NewRequest("GET", "/debug/status", nil))
	if !strings.Contains(rec.Body.String(), `"externalIPsIgnored": [`) {
		t.Errorf("status lacks externalIPsIgnored:\n%s", rec.Body.String())
	}
}

// sync_proxy_rules_no_local_endpoints_total counts the service ports that a
// Local policy leaves without endpoints here, per policy and family.
func TestNoLocalEndpointsMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newMetrics(reg, state.New(nil), func() float64 { return 0 }, func() float64 { return 0 })
	m.setNoLocalEndpoints([]datapath.Frontend{
		{Service: datapath.ServicePortName{Namespace: "a", Name: "x"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Family: datapath.IPv4, Drop: true},
		{Service: datapath.ServicePortName{Namespace: "a", Name: "x"}, Kind: datapath.NodePort, Protocol: datapath.TCP, Family: datapath.IPv4, Drop: true},
		{Service: datapath.ServicePortName{Namespace: "a", Name: "x"}, Kind: datapath.LoadBalancer, Protocol: datapath.TCP, Family: datapath.IPv4, Drop: true},
		{Service: datapath.ServicePortName{Namespace: "a", Name: "y"}, Kind: datapath.NodePort, Protocol: datapath.UDP, Family: datapath.IPv6, Drop: true},
		{Service: datapath.ServicePortName{Namespace: "a", Name: "z"}, Kind: datapath.NodePort, Protocol: datapath.TCP, Family: datapath.IPv4},
	})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "kubeproxy_sync_proxy_rules_no_local_endpoints_total" {
			continue
		}
		for _, mm := range mf.GetMetric() {
			l := mm.GetLabel()
			got[l[0].GetValue()+"/"+l[1].GetValue()] = mm.GetGauge().GetValue()
		}
	}
	want := map[string]float64{"IPv4/internal": 1, "IPv4/external": 1, "IPv6/internal": 0, "IPv6/external": 1}
	if !maps.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// The first sync closes Synced and tells systemd it is ready before it
// returns to the runner, which records its success only then: in between,
// a start that took longer than healthTimeout must not answer 503.
func TestHealthyOnceFirstSyncProgrammed(t *testing.T) {
	cfg := config.Default()
	cfg.NodeName, cfg.Manifests, cfg.Mode = "n1", t.TempDir(), "plan"
	cfg.StateDir = t.TempDir()
	cfg.Server = config.Server{}
	cfg.Sync.HealthTimeout = 300 * time.Millisecond
	a, err := New(Options{Config: &cfg, Backend: &flaky{}, Registry: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	a.startTime = now.Add(-time.Minute) // a slow start
	if h := a.HealthNow(now); h.Healthy {
		t.Fatalf("health before any sync after a minute = %+v, want unhealthy", h)
	}
	a.firstSynced.Store(now.Add(-time.Millisecond).UnixNano())
	if h := a.HealthNow(now); !h.Healthy || h.LastUpdated.IsZero() {
		t.Fatalf("health once the first sync programmed = %+v, want healthy with LastUpdated", h)
	}
}
