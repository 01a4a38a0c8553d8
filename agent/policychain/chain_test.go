package policychain_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/agent/policychain"
	"github.com/edgeproxy/edgeproxy/agent/runner/runnertest"
	"github.com/edgeproxy/edgeproxy/internal/testkit/logbuf"
	"github.com/edgeproxy/edgeproxy/modules/modbuild"
	"github.com/edgeproxy/edgeproxy/policy"
)

// stateDir is shared by the tests so that each module compiles once.
var stateDir string

func TestMain(m *testing.M) {
	d, err := os.MkdirTemp("", "edgeproxy-chain-test")
	if err != nil {
		panic(err)
	}
	stateDir = d
	code := m.Run()
	os.RemoveAll(d)
	os.Exit(code)
}

// modulePath builds a module and copies it to a file the test owns.
func modulePath(t testing.TB, dir string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), filepath.Base(dir)+".wasm")
	if err := os.WriteFile(p, modbuild.Build(t, dir), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func policyConfig(mods map[string]string, chains ...config.Chain) config.Policy {
	p := config.Default().Policy
	p.Timeout = 100 * time.Millisecond // the machine is shared; behaviour, not speed
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range mods {
			if !yield(k) {
				return
			}
		}
	}) {
		p.Modules = append(p.Modules, config.Module{Name: name, Path: mods[name]})
	}
	p.Chains = chains
	return p
}

func newEvaluator(t testing.TB, cfg config.Policy, opts ...policychain.Option) (*policychain.Evaluator, *logbuf.Buffer, *prometheus.Registry) {
	t.Helper()
	logs := &logbuf.Buffer{}
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e, err := policychain.New(context.Background(), cfg, stateDir, log, reg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	return e, logs, reg
}

// metric returns the value of the series of name whose labels include
// every given name=value pair.
func metric(t testing.TB, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	if v := metricValues(t, reg, name, labels...); len(v) > 0 {
		return v[0]
	}
	return 0
}

// metricSum adds up every series of name whose labels include every given
// name=value pair.
func metricSum(t testing.TB, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	var sum float64
	for _, v := range metricValues(t, reg, name, labels...) {
		sum += v
	}
	return sum
}

// metricValues returns the value of each series of name whose labels
// include every given name=value pair: a counter's value, a histogram's
// sample count.
func metricValues(t testing.TB, reg *prometheus.Registry, name string, labels ...string) []float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				out = append(out, m.GetCounter().GetValue())
			case m.GetHistogram() != nil:
				out = append(out, float64(m.GetHistogram().GetSampleCount()))
			}
		}
	}
	return out
}

var (
	node = &model.Node{Name: "edge-1", Zone: "zone-a", Region: "eu", Labels: map[string]string{"site": "berlin", "other": "x"}}
	port = model.ServicePort{Name: "http", Protocol: "TCP", Port: 80}
)

func service(ns string, ann map[string]string) *model.Service {
	return &model.Service{Namespace: ns, Name: "web", Annotations: ann, Labels: map[string]string{"app": "web"}, Ports: []model.ServicePort{port}}
}

// endpoints returns one endpoint per zone given, on nodes edge-2...
func endpoints(zones ...string) []model.PortEndpoint {
	var eps []model.PortEndpoint
	for i, z := range zones {
		eps = append(eps, model.PortEndpoint{Port: 8080, Endpoint: &model.Endpoint{
			Addr: netip.AddrFrom4([4]byte{10, 1, 0, byte(i + 1)}), NodeName: fmt.Sprintf("edge-%d", i+2),
			Zone: z, Ready: true, Serving: true,
		}})
	}
	return eps
}

func TestTopologyFollowsZones(t *testing.T) {
	ctx := context.Background()
	cfg := policyConfig(map[string]string{"topology": modulePath(t, "modules/topology")},
		config.Chain{Name: "close", Match: config.Match{Namespaces: []string{"shop"}}, Modules: []config.ChainStep{{Module: "topology"}}})
	e, _, reg := newEvaluator(t, cfg)
	svc := service("shop", nil)

	eps := endpoints("zone-a", "zone-b", "zone-a", "zone-c")
	v := e.Evaluate(ctx, svc, port, node, eps)
	if want := []uint32{1, 0, 1, 0}; !slices.Equal(v.Weights, want) || v.Chain != "close" || v.Fallback != "" {
		t.Fatalf("zone-a endpoints: %s, want weights %v", v, want)
	}
	// The endpoints move: now only the second and fourth are in our zone.
	moved := endpoints("zone-b", "zone-a", "zone-c", "zone-a")
	v = e.Evaluate(ctx, svc, port, node, moved)
	if want := []uint32{0, 1, 0, 1}; !slices.Equal(v.Weights, want) {
		t.Fatalf("after the move: %s, want weights %v", v, want)
	}
	if !strings.Contains(v.Steps[0].Reason, "zone: 2 of 4") {
		t.Errorf("reason %q", v.Steps[0].Reason)
	}
	// An endpoint on this node wins over the zone.
	local := endpoints("zone-b", "zone-a", "zone-a")
	local[0].NodeName = node.Name
	if v = e.Evaluate(ctx, svc, port, node, local); !slices.Equal(v.Weights, []uint32{1, 0, 0}) {
		t.Fatalf("local endpoint: %s", v)
	}
	// Unchanged input: answered from the cache, the module is not called.
	calls := metric(t, reg, "edgeproxy_policy_module_evaluation_seconds", "module", "topology")
	v = e.Evaluate(ctx, svc, port, node, moved)
	if !v.Steps[0].Cached || metric(t, reg, "edgeproxy_policy_module_evaluation_seconds", "module", "topology") != calls {
		t.Fatalf("unchanged input re-ran the module: %s", v)
	}
	// A service no chain matches keeps the built-in selection.
	if v = e.Evaluate(ctx, service("other", nil), port, node, eps); v.Chain != "" || !slices.Equal(v.Weights, []uint32{1, 1, 1, 1}) {
		t.Fatalf("unmatched service: %+v", v)
	}
}

func TestWeightedAnnotation(t *testing.T) {
	ctx := context.Background()
	cfg := policyConfig(map[string]string{"weighted": modulePath(t, "modules/weighted"), "scheduler": modulePath(t, "modules/scheduler")},
		config.Chain{Name: "canary", Match: config.Match{Labels: map[string]string{"app": "web"}},
			Modules: []config.ChainStep{{Module: "weighted", Config: map[string]any{"default": 10}}, {Module: "scheduler"}}})
	e, _, _ := newEvaluator(t, cfg)
	eps := endpoints("zone-a", "zone-b", "zone-a")
	eps[2].NodeName = "canary-1"
	svc := service("shop", map[string]string{
		"edgeproxy.io/weights":   "zone:zone-a=80, zone:zone-b=20, node:canary-*=1",
		"edgeproxy.io/scheduler": "sh:sh-port",
	})
	v := e.Evaluate(ctx, svc, port, node, eps)
	if want := []uint32{80, 20, 1}; !slices.Equal(v.Weights, want) {
		t.Fatalf("%s, want weights %v", v, want)
	}
	if v.Scheduler != "sh" || !slices.Equal(v.SchedulerFlags, []string{"sh-port"}) {
		t.Fatalf("scheduler %q %v", v.Scheduler, v.SchedulerFlags)
	}
	// Annotations outside the prefix never reach a module.
	e2, _, _ := newEvaluator(t, cfg, policychain.WithServiceKeyPrefix("example.com/"))
	if v = e2.Evaluate(ctx, svc, port, node, eps); !slices.Equal(v.Weights, []uint32{10, 10, 10}) || v.Scheduler != "" {
		t.Fatalf("prefix example.com/: %s, want the config default everywhere", v)
	}
}

// TestNewRefusedClaimsNothing: modules refused at start (New) are logged
// and counted as refused, with no word of previous chains that keep
// running: there are none (issue 29 §7).
func TestNewRefusedClaimsNothing(t *testing.T) {
	logs := &logbuf.Buffer{}
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(logs, nil))
	cfg := policyConfig(map[string]string{"m": filepath.Join(t.TempDir(), "missing.wasm")},
		config.Chain{Name: "c", Modules: []config.ChainStep{{Module: "m"}}})
	if e, err := policychain.New(context.Background(), cfg, stateDir, log, reg); err == nil {
		e.Close(context.Background())
		t.Fatal("New accepted a missing module")
	}
	if !strings.Contains(logs.String(), "policy: modules refused") || strings.Contains(logs.String(), "keep running") {
		t.Errorf("log of the refusal at start, want one naming it and no chains kept running:\n%s", logs)
	}
	if n := metric(t, reg, "edgeproxy_policy_reloads_total", "result", "failure"); n != 1 {
		t.Errorf("failed loads metric %v, want 1", n)
	}
}

func TestReloadBrokenModuleKeepsOld(t *testing.T) {
	ctx := context.Background()
	path := modulePath(t, "modules/topology")
	cfg := policyConfig(map[string]string{"m": path},
		config.Chain{Name: "c", Modules: []config.ChainStep{{Module: "m"}}})
	e, logs, reg := newEvaluator(t, cfg)
	eps := endpoints("zone-a", "zone-b")
	want := []uint32{1, 0}
	if v := e.Evaluate(ctx, service("shop", nil), port, node, eps); !slices.Equal(v.Weights, want) {
		t.Fatalf("before: %s", v)
	}
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, broken := range []struct{ name, module, pin string }{
		{"truncated", "", ""},
		{"forbidden import", "modules/testdata/hostile/forbidden", ""},
		{"wrong signature", "modules/testdata/hostile/badsig", ""},
		{"missing export", "modules/testdata/hostile/noexport", ""},
		{"loops in the probe", "modules/testdata/hostile/loop", ""},
		{"wrong hash", "", strings.Repeat("0", 64)},
	} {
		b := []byte("\x00asm\x01\x00\x00\x00\x01\x05")
		switch {
		case broken.module != "":
			b = modbuild.Build(t, broken.module)
		case broken.pin != "":
			b = good
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		next := cfg
		next.Modules = []config.Module{{Name: "m", Path: path, SHA256: broken.pin}}
		if err := e.Reload(ctx, next); err == nil {
			t.Fatalf("%s: reload accepted a broken module", broken.name)
		}
		if v := e.Evaluate(ctx, service("shop", nil), port, node, eps); !slices.Equal(v.Weights, want) || v.Fallback != "" {
			t.Fatalf("%s: after the failed reload: %s, want the old module's %v", broken.name, v, want)
		}
	}
	if n := metric(t, reg, "edgeproxy_policy_reloads_total", "result", "failure"); n != 6 {
		t.Errorf("failed reloads metric %v, want 6", n)
	}
	if !strings.Contains(logs.String(), "previous chains keep running") {
		t.Errorf("no log line for the refused reload:\n%s", logs)
	}
	// A good file is picked up.
	if err := os.WriteFile(path, modbuild.Build(t, "modules/weighted"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := e.Reload(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if v := e.Evaluate(ctx, service("shop", nil), port, node, eps); !slices.Equal(v.Weights, []uint32{100, 100}) {
		t.Fatalf("after a good reload: %s", v)
	}
}

// TestHostileContained: modules that fail at run time get their chain's
// failure policy, a metric and a log line, and other services keep being
// served.
func TestHostileContained(t *testing.T) {
	ctx := context.Background()
	only := map[string]any{"only": "hostile"}
	cases := []struct {
		module  string
		reason  policy.Reason
		failure string
	}{
		{"loop", policy.ReasonTimeout, config.FailureKeepBuiltin},
		{"trap", policy.ReasonTrap, config.FailureKeepBuiltin},
		{"range", policy.ReasonInvalid, config.FailureKeepBuiltin},
		{"wronglen", policy.ReasonInvalid, config.FailureLastGood},
		{"zero", policy.ReasonInvalid, config.FailureKeepBuiltin},
		{"memory", policy.ReasonTrap, config.FailureKeepBuiltin}, // or timeout, see below
	}
	for _, c := range cases {
		t.Run(c.module, func(t *testing.T) {
			clk := runnertest.NewClock(time.Unix(1e9, 0))
			cfg := policyConfig(map[string]string{"topology": modulePath(t, "modules/topology"), c.module: modulePath(t, "modules/testdata/hostile/"+c.module)},
				config.Chain{Name: "h", Failure: c.failure, Modules: []config.ChainStep{{Module: "topology"}, {Module: c.module, Config: only}}})
			e, logs, reg := newEvaluator(t, cfg, policychain.WithClock(clk.Now))
			eps := endpoints("zone-a", "zone-b", "zone-a")
			v := e.Evaluate(ctx, service("hostile", nil), port, node, eps)
			if v.Fallback != config.FailureKeepBuiltin || !slices.Equal(v.Weights, []uint32{1, 1, 1}) {
				t.Fatalf("%s, want keep-builtin (no last good yet)", v)
			}
			last := v.Steps[len(v.Steps)-1]
			if c.module == "memory" && last.Failure == policy.ReasonTimeout {
				c.reason = policy.ReasonTimeout // the guest GC may use up the deadline before memory.grow fails
			}
			if last.Module != c.module || last.Failure != c.reason {
				t.Fatalf("step %+v, want failure %s", last, c.reason)
			}
			if n := metric(t, reg, "edgeproxy_policy_module_failures_total", "module", c.module, "reason", string(c.reason)); n != 1 {
				t.Errorf("failure metric %v, want 1", n)
			}
			if !strings.Contains(logs.String(), "failure policy applied") || !strings.Contains(logs.String(), "module="+c.module) {
				t.Errorf("no log line:\n%s", logs)
			}
			// Another service is still served by the chain.
			clk.Step(time.Minute) // past any re-instantiation backoff
			if v := e.Evaluate(ctx, service("shop", nil), port, node, eps); v.Fallback != "" || !slices.Equal(v.Weights, []uint32{1, 0, 1}) {
				t.Fatalf("other service: %s", v)
			}
		})
	}
	t.Run("allowEmpty", func(t *testing.T) {
		cfg := policyConfig(map[string]string{"zero": modulePath(t, "modules/testdata/hostile/zero")},
			config.Chain{Name: "drain", AllowEmpty: true, Modules: []config.ChainStep{{Module: "zero", Config: only}}})
		e, _, _ := newEvaluator(t, cfg)
		if v := e.Evaluate(ctx, service("hostile", nil), port, node, endpoints("zone-a", "zone-b")); v.Fallback != "" || !slices.Equal(v.Weights, []uint32{0, 0}) {
			t.Fatalf("%s, want the service emptied as the chain allows", v)
		}
	})
}

// TestLastGood: when a module fails, a last-good chain keeps the weights
// of its last valid answer for that service port, across a reload.
func TestLastGood(t *testing.T) {
	ctx := context.Background()
	topo := modulePath(t, "modules/topology")
	cfg := policyConfig(map[string]string{"m": topo},
		config.Chain{Name: "c", Failure: config.FailureLastGood, Modules: []config.ChainStep{{Module: "m"}}})
	e, _, _ := newEvaluator(t, cfg)
	svc := service("hostile", nil)
	eps := endpoints("zone-a", "zone-b", "zone-a")
	if v := e.Evaluate(ctx, svc, port, node, eps); !slices.Equal(v.Weights, []uint32{1, 0, 1}) {
		t.Fatalf("good: %s", v)
	}
	// The new version of module m returns out-of-range weights for svc.
	cfg.Modules[0].Path = modulePath(t, "modules/testdata/hostile/range")
	cfg.Chains[0].Modules[0].Config = map[string]any{"only": "hostile"}
	if err := e.Reload(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	v := e.Evaluate(ctx, svc, port, node, eps)
	if v.Fallback != config.FailureLastGood || !slices.Equal(v.Weights, []uint32{1, 0, 1}) {
		t.Fatalf("%s, want last-good [1 0 1]", v)
	}
}

func TestInputKeys(t *testing.T) {
	// The node labels and service keys handed to modules are exactly the
	// configured ones: shown through the weighted module's annotation
	// lookup and the scheduler module's port rules.
	ctx := context.Background()
	cfg := policyConfig(map[string]string{"s": modulePath(t, "modules/scheduler")},
		config.Chain{Name: "c", Match: config.Match{Annotations: map[string]string{"edgeproxy.io/sched": "yes"}},
			Modules: []config.ChainStep{{Module: "s", Config: map[string]any{"ports": map[string]string{"http": "mh:mh-port"}}}}})
	e, _, _ := newEvaluator(t, cfg, policychain.WithNodeLabels([]string{"site"}))
	svc := service("shop", map[string]string{"edgeproxy.io/sched": "yes"})
	v := e.Evaluate(ctx, svc, port, node, endpoints("zone-a"))
	if v.Scheduler != "mh" || !slices.Equal(v.SchedulerFlags, []string{"mh-port"}) || !slices.Equal(v.Weights, []uint32{1}) {
		t.Fatalf("%s", v)
	}
	if v := e.Evaluate(ctx, service("shop", nil), port, node, endpoints("zone-a")); v.Chain != "" {
		t.Fatalf("annotation selector ignored: %s", v)
	}
}

func TestCheckFile(t *testing.T) {
	ctx := context.Background()
	cfg := config.Default().Policy
	r, err := policychain.CheckFile(ctx, cfg, modulePath(t, "modules/topology"), nil)
	if err != nil || !r.OK() {
		t.Fatalf("topology: %v\n%s", err, r)
	}
	p := modulePath(t, "modules/testdata/hostile/forbidden")
	r, err = policychain.CheckFile(ctx, cfg, p, nil)
	if err == nil || r == nil || !strings.Contains(r.String(), "path_open is not allowed") {
		t.Fatalf("forbidden: %v\n%s", err, r)
	}
	cfg.Modules = []config.Module{{Name: "pinned", Path: modulePath(t, "modules/topology"), SHA256: strings.Repeat("ab", 32)}}
	if r, err = policychain.CheckFile(ctx, cfg, cfg.Modules[0].Path, nil); err == nil || r.Module != "pinned" {
		t.Fatalf("wrong pin accepted: %v\n%s", err, r)
	}
}

// TestEvaluateBatch: a batch over two chains and no chain gives each port
// the verdict Evaluate gives it alone; in a two-step chain whose second
// module fails on one port, that port alone falls back, its batch-mates
// keep the weights of both steps.
func TestEvaluateBatch(t *testing.T) {
	ctx := context.Background()
	topo, trap := modulePath(t, "modules/topology"), modulePath(t, "modules/testdata/hostile/trap")
	cfg := policyConfig(map[string]string{"topology": topo, "trap": trap},
		config.Chain{Name: "close", Match: config.Match{Namespaces: []string{"shop"}}, Modules: []config.ChainStep{{Module: "topology"}}},
		config.Chain{Name: "two", Match: config.Match{Namespaces: []string{"hostile", "calm"}},
			Modules: []config.ChainStep{{Module: "topology"}, {Module: "trap", Config: map[string]any{"only": "hostile"}}}})
	e, _, _ := newEvaluator(t, cfg)
	alone, _, _ := newEvaluator(t, cfg)
	eps := endpoints("zone-a", "zone-b", "zone-a")
	var reqs []policychain.Request
	for _, ns := range []string{"shop", "calm", "other", "hostile", "calm", "shop"} {
		reqs = append(reqs, policychain.Request{Service: service(ns, nil), Port: port, Node: node, Endpoints: eps})
	}
	reqs[4].Port.Port, reqs[5].Endpoints = 81, endpoints("zone-b", "zone-a")
	got := e.EvaluateBatch(ctx, reqs)
	for k, r := range reqs {
		want := alone.Evaluate(ctx, r.Service, r.Port, r.Node, r.Endpoints)
		if got[k].String() != want.String() {
			t.Errorf("request %d (%s): batch %s, alone %s", k, r.Service.Namespace, got[k], want)
		}
		switch ns := r.Service.Namespace; {
		case ns == "hostile" && (got[k].Fallback != config.FailureKeepBuiltin || len(got[k].Steps) != 2 || got[k].Steps[1].Failure != policy.ReasonTrap):
			t.Errorf("hostile port: %s, want a trap in step 2 and keep-builtin", got[k])
		case ns != "hostile" && got[k].Fallback != "":
			t.Errorf("request %d (%s) fell back: %s", k, ns, got[k])
		case ns == "calm" && len(got[k].Steps) != 2:
			t.Errorf("calm port: %s, want two steps", got[k])
		}
	}
}
