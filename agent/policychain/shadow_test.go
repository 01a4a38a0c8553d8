package policychain_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/agent/policychain"
	"github.com/edgeproxy/edgeproxy/agent/runner/runnertest"
	"github.com/edgeproxy/edgeproxy/policy"
)

// withShadow adds module name (file path) as a shadow of of, with its own
// module config when conf is not nil.
func withShadow(p config.Policy, name, path, of string, conf map[string]any) config.Policy {
	p.Modules = append(slices.Clone(p.Modules), config.Module{Name: name, Path: path, ShadowOf: of, Config: conf})
	return p
}

// sameTraffic fails unless got gives every endpoint the weights,
// scheduler, steps and fallback of want: what the datapath is built from.
func sameTraffic(t *testing.T, what string, got, want policychain.Verdict) {
	t.Helper()
	got.Shadows = nil
	if got.String() != want.String() || !slices.Equal(got.Weights, want.Weights) || got.Fallback != want.Fallback {
		t.Fatalf("%s: with the shadow %s\nwithout it  %s", what, got, want)
	}
}

// TestShadowCandidateDiffers: a candidate weighted with another default
// runs next to the active one; its differences are counted once per input
// and recorded with the input hash and both outputs, and the verdict is
// the one the chain gives without it.
func TestShadowCandidateDiffers(t *testing.T) {
	ctx := context.Background()
	weighted := modulePath(t, "modules/weighted")
	base := policyConfig(map[string]string{"weighted": weighted},
		config.Chain{Name: "canary", Match: config.Match{Namespaces: []string{"shop"}},
			Modules: []config.ChainStep{{Module: "weighted", Config: map[string]any{"default": 10}}}})
	cfg := withShadow(base, "weighted-next", weighted, "weighted", map[string]any{"default": 30})
	e, _, reg := newEvaluator(t, cfg)
	plain, _, _ := newEvaluator(t, base)

	eps := endpoints("zone-a", "zone-b", "zone-a")
	svc := service("shop", nil)
	canary := service("shop", map[string]string{"edgeproxy.io/weights": "zone:zone-b=5"})
	canary.Name = "canary"
	reqs := []policychain.Request{
		{Service: svc, Port: port, Node: node, Endpoints: eps},
		{Service: canary, Port: port, Node: node, Endpoints: eps},
		{Service: service("other", nil), Port: port, Node: node, Endpoints: eps},
	}
	got := e.EvaluateBatch(ctx, reqs)
	for k, r := range reqs {
		sameTraffic(t, r.Service.Namespace+"/"+r.Service.Name, got[k], plain.Evaluate(ctx, r.Service, r.Port, r.Node, r.Endpoints))
	}
	if !slices.Equal(got[0].Weights, []uint32{10, 10, 10}) {
		t.Fatalf("active weights %v, want the active default 10", got[0].Weights)
	}
	s := got[0].Shadows
	if len(s) != 1 || s[0].Module != "weighted-next" || s[0].Of != "weighted" || !slices.Equal(s[0].Weights, []uint32{30, 30, 30}) ||
		!strings.Contains(s[0].Diff, "weights differ at 3 of 3 endpoints: 10.1.0.1:8080 10->30") || len(s[0].InputSHA256) != 64 {
		t.Fatalf("shadow of shop/web: %+v", s)
	}
	// The annotation sets zone-b's weight for both: they differ elsewhere.
	if s := got[1].Shadows; len(s) != 1 || !strings.Contains(s[0].Diff, "differ at 2 of 3") {
		t.Fatalf("shadow of shop/canary: %+v", s)
	}
	if len(got[2].Shadows) != 0 {
		t.Fatalf("a port no chain matches ran a shadow: %+v", got[2])
	}
	if n := metric(t, reg, "edgeproxy_policy_shadow_diff_total", "module", "weighted-next"); n != 2 {
		t.Errorf("diff metric %v, want 2", n)
	}
	rep := e.ShadowReport("shop/web")
	if len(rep.Diffs) != 1 {
		t.Fatalf("report for shop/web: %+v", rep)
	}
	d := rep.Diffs[0]
	if d.Service != (model.ServicePortName{Namespace: "shop", Name: "web", Port: "http"}) || d.Chain != "canary" || d.InputSHA256 != s[0].InputSHA256 ||
		!slices.Equal(d.Active.Weights, []uint32{10, 10, 10}) || !slices.Equal(d.Shadow.Weights, []uint32{30, 30, 30}) ||
		!slices.Equal(d.Endpoints, []string{"10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080"}) || d.Reason != s[0].Diff {
		t.Fatalf("recorded difference %+v", d)
	}
	if len(rep.Modules) != 1 || rep.Modules[0].Differences != 2 || rep.Modules[0].Compared != 2 || !rep.Modules[0].Loaded {
		t.Fatalf("report modules %+v", rep.Modules)
	}

	// The same inputs again: both answer from their caches, the verdict
	// still shows the difference, it is not counted again.
	again := e.EvaluateBatch(ctx, reqs)
	if again[0].Shadows[0].Diff == "" || !again[0].Shadows[0].Cached {
		t.Fatalf("repeat: %+v", again[0].Shadows)
	}
	if n := metric(t, reg, "edgeproxy_policy_shadow_diff_total", "module", "weighted-next"); n != 2 {
		t.Errorf("diff metric after a repeat %v, want 2", n)
	}
	if got := len(e.ShadowReport("").Diffs); got != 2 {
		t.Errorf("%d differences recorded, want 2", got)
	}

	// The history is bounded.
	for i := range policychain.ShadowHistory + 10 {
		more := endpoints("zone-a", "zone-b")
		more[0].Port = uint16(9000 + i)
		e.Evaluate(ctx, svc, port, node, more)
	}
	if got := len(e.ShadowReport("").Diffs); got != policychain.ShadowHistory {
		t.Errorf("%d differences kept, want %d", got, policychain.ShadowHistory)
	}
}

// TestShadowIdentical: a shadow that is the active module with the same
// config records no difference.
func TestShadowIdentical(t *testing.T) {
	ctx := context.Background()
	topo := modulePath(t, "modules/topology")
	cfg := withShadow(policyConfig(map[string]string{"topology": topo},
		config.Chain{Name: "close", Modules: []config.ChainStep{{Module: "topology", Config: map[string]any{"minEndpoints": 2}}}}),
		"topology-copy", modulePath(t, "modules/topology"), "topology", nil)
	e, _, reg := newEvaluator(t, cfg)
	for _, eps := range [][]model.PortEndpoint{endpoints("zone-a", "zone-b", "zone-a"), endpoints("zone-b", "zone-c"), endpoints("zone-a")} {
		v := e.Evaluate(ctx, service("shop", nil), port, node, eps)
		if len(v.Shadows) != 1 || v.Shadows[0].Diff != "" || v.Shadows[0].Failure != "" || !slices.Equal(v.Shadows[0].Weights, v.Weights) {
			t.Fatalf("%s: shadow %+v", v, v.Shadows)
		}
	}
	if n := metric(t, reg, "edgeproxy_policy_shadow_compared_total", "module", "topology-copy"); n != 3 {
		t.Errorf("compared %v, want 3", n)
	}
	if n := metric(t, reg, "edgeproxy_policy_shadow_diff_total", "module", "topology-copy"); n != 0 {
		t.Errorf("diff metric %v, want 0", n)
	}
	if rep := e.ShadowReport(""); len(rep.Diffs) != 0 {
		t.Errorf("differences recorded: %+v", rep.Diffs)
	}
}

// TestShadowHostileChangesNothing: a shadow that spins, traps, blows its
// memory or answers garbage changes no verdict, trips no breaker of the
// active step, applies no failure policy; its failures are counted as the
// shadow's, and its own breaker opens.
func TestShadowHostileChangesNothing(t *testing.T) {
	ctx := context.Background()
	topo := modulePath(t, "modules/topology")
	cases := []struct {
		module string
		reason []policy.Reason // any of
	}{
		{"loop", []policy.Reason{policy.ReasonTimeout}},
		{"trap", []policy.Reason{policy.ReasonTrap}},
		{"memory", []policy.Reason{policy.ReasonTrap, policy.ReasonTimeout}}, // the guest GC may use up the deadline first
		{"range", []policy.Reason{policy.ReasonInvalid}},
		{"wronglen", []policy.Reason{policy.ReasonInvalid}},
		{"zero", []policy.Reason{policy.ReasonInvalid}},
	}
	for _, c := range cases {
		t.Run(c.module, func(t *testing.T) {
			clk := runnertest.NewClock(time.Unix(1e9, 0))
			base := policyConfig(map[string]string{"topology": topo},
				config.Chain{Name: "h", Failure: config.FailureLastGood, Modules: []config.ChainStep{{Module: "topology"}}})
			base.ShadowBudget = time.Minute // the module's own deadline, not the budget, stops it here
			// It misbehaves for namespace hostile only: one that always did
			// would be refused by the load checks (shown in
			// TestShadowReloadAndPromotion).
			cfg := withShadow(base, c.module, modulePath(t, "modules/testdata/hostile/"+c.module), "topology", map[string]any{"only": "hostile"})
			e, _, reg := newEvaluator(t, cfg, policychain.WithClock(clk.Now))
			plain, _, _ := newEvaluator(t, base, policychain.WithClock(clk.Now))
			// Eight syncs, each with new endpoints (no cache), two ports each.
			for i := range 8 {
				eps := endpoints("zone-a", "zone-b", "zone-a")
				for j := range eps {
					eps[j].Port = uint16(8000 + i)
				}
				reqs := []policychain.Request{
					{Service: service("hostile", nil), Port: port, Node: node, Endpoints: eps},
					{Service: service("shop", nil), Port: port, Node: node, Endpoints: eps[:2]},
				}
				got := e.EvaluateBatch(ctx, reqs)
				for k, r := range reqs {
					sameTraffic(t, r.Service.Namespace, got[k], plain.Evaluate(ctx, r.Service, r.Port, r.Node, r.Endpoints))
					if got[k].Fallback != "" || len(got[k].Shadows) != 1 || (got[k].Shadows[0].Failure == "") != (k == 1) {
						t.Fatalf("sync %d: %s, shadows %+v", i, got[k], got[k].Shadows)
					}
				}
				clk.Step(time.Second)
			}
			// The hostile port alone: the shadow's consecutive failures open
			// its circuit; still nothing changes for traffic.
			for i := range 6 {
				eps := endpoints("zone-a", "zone-b")
				eps[0].Port = uint16(7000 + i)
				svc := service("hostile", nil)
				sameTraffic(t, "hostile alone", e.Evaluate(ctx, svc, port, node, eps), plain.Evaluate(ctx, svc, port, node, eps))
			}
			for _, m := range e.Modules() {
				if m.ShadowOf == "" && (m.State.Failures != 0 || !m.State.OpenUntil.IsZero()) {
					t.Errorf("active step %s: %+v", m.Module, m.State)
				}
			}
			if n := metric(t, reg, "edgeproxy_policy_module_failures_total"); n != 0 {
				t.Errorf("module failures metric %v, want 0: shadow failures are not the chain's", n)
			}
			if n := metric(t, reg, "edgeproxy_policy_fallbacks_total"); n != 0 {
				t.Errorf("fallbacks %v, want 0", n)
			}
			// Every hostile evaluation failed as the shadow's, none was
			// skipped; on a loaded machine a trap may run past its deadline
			// first, so the reason is checked loosely.
			total := metricSum(t, reg, "edgeproxy_policy_shadow_failures_total", "module", c.module)
			open := metric(t, reg, "edgeproxy_policy_shadow_failures_total", "module", c.module, "reason", string(policy.ReasonCircuitOpen))
			var own float64
			reasons := append(slices.Clone(c.reason), policy.ReasonTimeout)
			slices.Sort(reasons)
			for _, r := range slices.Compact(reasons) {
				own += metric(t, reg, "edgeproxy_policy_shadow_failures_total", "module", c.module, "reason", string(r))
			}
			if total != 14 || own+open != 14 || own < 5 || open == 0 {
				t.Errorf("shadow failures: %v in all, %v as %v (or timeout), %v circuit_open; want 14, its circuit opened", total, own, c.reason, open)
			}
			if rep := e.ShadowReport(""); rep.Modules[0].LastFailure == "" {
				t.Errorf("report without the last failure: %+v", rep.Modules)
			}
		})
	}
}

// TestShadowBudget: once a sync's shadow time is spent, shadows are
// skipped for the rest of it (every batch under one WithShadowBudget
// context), counted, logged once per policy load (issue 29 §7: a budget
// of 1ns was silent but for a metric), shown in the modules' status, and
// the chain's answer is unchanged.
func TestShadowBudget(t *testing.T) {
	topo := modulePath(t, "modules/topology")
	base := policyConfig(map[string]string{"topology": topo},
		config.Chain{Name: "close", Modules: []config.ChainStep{{Module: "topology"}}})
	base.ShadowBudget = time.Nanosecond
	e, logs, reg := newEvaluator(t, withShadow(base, "copy", topo, "topology", nil))
	ctx := policychain.WithShadowBudget(context.Background())
	for i := range 3 {
		v := e.Evaluate(ctx, service("shop", nil), port, node, endpoints("zone-a", "zone-b"))
		if !slices.Equal(v.Weights, []uint32{1, 0}) || len(v.Shadows) != 1 || v.Shadows[0].Failure != policychain.ShadowSkipped {
			t.Fatalf("batch %d: %s %+v", i, v, v.Shadows)
		}
	}
	if n := metric(t, reg, "edgeproxy_policy_shadow_failures_total", "module", "copy", "reason", policychain.ShadowSkipped); n != 3 {
		t.Errorf("skipped %v, want 3", n)
	}
	const warning = `level=WARN msg="policy: shadow evaluations skipped: the sync's shadow budget is spent`
	if n := strings.Count(logs.String(), warning); n != 1 {
		t.Errorf("%d log lines say %q, want 1:\n%s", n, warning, logs)
	}
	var skipped []uint64
	for _, m := range e.Modules() {
		if m.ShadowOf != "" {
			skipped = append(skipped, m.Skipped)
		}
	}
	if !slices.Equal(skipped, []uint64{3}) {
		t.Errorf("status of the shadows: skipped %v, want [3]", skipped)
	}
	// A new sync has a budget of its own: a generous one lets it run.
	base.ShadowBudget = time.Minute
	if err := e.Reload(context.Background(), withShadow(base, "copy", topo, "topology", nil)); err != nil {
		t.Fatal(err)
	}
	v := e.Evaluate(policychain.WithShadowBudget(context.Background()), service("shop", nil), port, node, endpoints("zone-a", "zone-b"))
	if len(v.Shadows) != 1 || v.Shadows[0].Failure != "" || v.Shadows[0].Diff != "" {
		t.Fatalf("new sync: %+v", v.Shadows)
	}
	for _, m := range e.Modules() {
		if m.Skipped != 0 {
			t.Errorf("after the reload with a generous budget, %s shows %d skipped", m.Module, m.Skipped)
		}
	}
}

// TestShadowReloadAndPromotion: a shadow whose file is broken does not
// stop a reload (it is shown with its error); promotion is a config edit
// that points the chain step at the shadow.
func TestShadowReloadAndPromotion(t *testing.T) {
	ctx := context.Background()
	weighted := modulePath(t, "modules/weighted")
	base := policyConfig(map[string]string{"weighted": weighted},
		config.Chain{Name: "canary", Modules: []config.ChainStep{{Module: "weighted", Config: map[string]any{"default": 10}}}})
	broken := tempFile(t, "broken.wasm", "\x00asm\x01\x00\x00\x00garbage")
	e, _, reg := newEvaluator(t, withShadow(base, "next", broken, "weighted", nil))
	v := e.Evaluate(ctx, service("shop", nil), port, node, endpoints("zone-a"))
	if !slices.Equal(v.Weights, []uint32{10}) || len(v.Shadows) != 0 {
		t.Fatalf("with a broken shadow: %s", v)
	}
	if rep := e.ShadowReport(""); len(rep.Modules) != 1 || rep.Modules[0].Loaded || rep.Modules[0].LoadErr == "" {
		t.Fatalf("report: %+v", rep.Modules)
	}
	if n := metric(t, reg, "edgeproxy_policy_shadow_failures_total", "module", "next", "reason", policychain.ShadowLoad); n != 1 {
		t.Errorf("load failures %v, want 1", n)
	}
	// A good candidate replaces it.
	withNext := withShadow(base, "next", weighted, "weighted", map[string]any{"default": 40})
	if err := e.Reload(ctx, withNext); err != nil {
		t.Fatal(err)
	}
	if v = e.Evaluate(ctx, service("shop", nil), port, node, endpoints("zone-a")); !slices.Equal(v.Weights, []uint32{10}) || v.Shadows[0].Diff == "" {
		t.Fatalf("candidate: %s", v)
	}
	// Promotion: the step runs the candidate with its config, shadowOf gone.
	promoted := withNext
	promoted.Modules = slices.Clone(withNext.Modules)
	promoted.Modules[1].ShadowOf, promoted.Modules[1].Config = "", nil
	promoted.Chains = []config.Chain{{Name: "canary", Modules: []config.ChainStep{{Module: "next", Config: map[string]any{"default": 40}}}}}
	if err := e.Reload(ctx, promoted); err != nil {
		t.Fatal(err)
	}
	if v = e.Evaluate(ctx, service("shop", nil), port, node, endpoints("zone-a")); !slices.Equal(v.Weights, []uint32{40}) || len(v.Shadows) != 0 {
		t.Fatalf("promoted: %s", v)
	}
}

func tempFile(t *testing.T, name, content string) string {
	t.Helper()
	p := t.TempDir() + "/" + name
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
