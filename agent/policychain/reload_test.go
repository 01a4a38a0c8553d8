package policychain_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/policychain"
)

// TestPrepareLeavesRunningChains: the chains in force answer while new
// ones are prepared, until Commit; Done without Commit drops the new ones.
func TestPrepareLeavesRunningChains(t *testing.T) {
	ctx := context.Background()
	weighted := modulePath(t, "modules/weighted")
	withDefault := func(w int) config.Policy {
		return policyConfig(map[string]string{"weighted": weighted},
			config.Chain{Name: "c", Modules: []config.ChainStep{{Module: "weighted", Config: map[string]any{"default": w}}}})
	}
	e, _, _ := newEvaluator(t, withDefault(10))
	weights := func() []uint32 {
		return e.Evaluate(ctx, service("shop", nil), port, node, endpoints("zone-a")).Weights
	}
	sw, err := e.Prepare(ctx, withDefault(20))
	if err != nil {
		t.Fatal(err)
	}
	if w := weights(); !slices.Equal(w, []uint32{10}) {
		t.Fatalf("prepared, not committed: %v, want the running [10]", w)
	}
	sw.Done(ctx) // abandoned
	if w := weights(); !slices.Equal(w, []uint32{10}) {
		t.Fatalf("abandoned: %v, want the running [10]", w)
	}
	if sw, err = e.Prepare(ctx, withDefault(30)); err != nil {
		t.Fatal(err)
	}
	sw.Commit()
	if w := weights(); !slices.Equal(w, []uint32{30}) {
		t.Fatalf("committed: %v, want [30]", w)
	}
	sw.Done(ctx)
	if w := weights(); !slices.Equal(w, []uint32{30}) {
		t.Fatalf("after Done: %v, want [30]", w)
	}
}

// TestReloadWhileEvaluating: evaluations running beside reloads each get
// one generation's answer whole, never a module closed under them (that
// would be a failure and a fallback). Run with -race.
func TestReloadWhileEvaluating(t *testing.T) {
	ctx := context.Background()
	weighted := modulePath(t, "modules/weighted")
	withDefault := func(w int) config.Policy {
		p := policyConfig(map[string]string{"weighted": weighted},
			config.Chain{Name: "c", Modules: []config.ChainStep{{Module: "weighted", Config: map[string]any{"default": w}}}})
		// A deadline is no test of this: on a loaded machine a call may
		// take its 100ms, and fail for that alone.
		p.Timeout = 10 * time.Second
		return p
	}
	e, _, _ := newEvaluator(t, withDefault(1))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bad []string
	var n int
	for range 2 {
		wg.Go(func() {
			eps := endpoints("zone-a", "zone-b")
			for {
				select {
				case <-stop:
					return
				default:
				}
				v := e.Evaluate(ctx, service("shop", nil), port, node, eps)
				mu.Lock()
				n++
				if v.Fallback != "" || len(v.Weights) != 2 || v.Weights[0] != v.Weights[1] || (v.Weights[0] != 1 && v.Weights[0] != 2) {
					bad = append(bad, v.String())
				}
				mu.Unlock()
			}
		})
	}
	for i := range 20 {
		if err := e.Reload(ctx, withDefault(1+(i+1)%2)); err != nil {
			t.Error(err)
		}
	}
	close(stop)
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("%d of %d evaluations beside reloads were not one generation's answer, e.g. %s", len(bad), n, bad[0])
	}
	t.Logf("%d evaluations beside 20 reloads", n)
}

// TestRemovedShadowForgotten (issue 29 §7): /debug/shadow drops the
// differences and counts of a shadow the config no longer has; those of
// a shadow that stays are kept.
func TestRemovedShadowForgotten(t *testing.T) {
	ctx := context.Background()
	weighted := modulePath(t, "modules/weighted")
	base := policyConfig(map[string]string{"weighted": weighted},
		config.Chain{Name: "c", Modules: []config.ChainStep{{Module: "weighted", Config: map[string]any{"default": 10}}}})
	both := withShadow(withShadow(base, "gone", weighted, "weighted", map[string]any{"default": 20}),
		"stays", weighted, "weighted", map[string]any{"default": 30})
	e, _, _ := newEvaluator(t, both)
	e.Evaluate(ctx, service("shop", nil), port, node, endpoints("zone-a"))
	modules := func(diffs []policychain.ShadowDiff) []string {
		var out []string
		for _, d := range diffs {
			out = append(out, d.Module)
		}
		return out
	}
	if rep := e.ShadowReport(""); !slices.Equal(modules(rep.Diffs), []string{"gone", "stays"}) {
		t.Fatalf("with both shadows: differences of %v", modules(rep.Diffs))
	}
	if err := e.Reload(ctx, withShadow(base, "stays", weighted, "weighted", map[string]any{"default": 30})); err != nil {
		t.Fatal(err)
	}
	rep := e.ShadowReport("")
	if !slices.Equal(modules(rep.Diffs), []string{"stays"}) || len(rep.Modules) != 1 || rep.Modules[0].Differences != 1 {
		t.Fatalf("after removing a shadow: differences of %v, modules %+v; want only those of stays", modules(rep.Diffs), rep.Modules)
	}
	if err := e.Reload(ctx, base); err != nil {
		t.Fatal(err)
	}
	if rep := e.ShadowReport(""); len(rep.Diffs) != 0 || len(rep.Modules) != 0 {
		t.Fatalf("without shadows: %+v", rep)
	}
	// Back again, it starts from nothing.
	if err := e.Reload(ctx, withShadow(base, "gone", weighted, "weighted", map[string]any{"default": 20})); err != nil {
		t.Fatal(err)
	}
	if rep := e.ShadowReport(""); len(rep.Diffs) != 0 || len(rep.Modules) != 1 || rep.Modules[0].Compared != 0 {
		t.Fatalf("shadow added again: %+v", rep)
	}
}
