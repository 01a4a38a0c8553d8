package policychain_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/agent/policychain"
)

// BenchmarkSync5k evaluates 5,000 service ports of 10 endpoints each, as
// one full sync would: "nochain" (no chain matches), "cold" (every input
// new: every port calls the topology module) and "warm" (a resync with
// nothing changed: every port answered from the cache). ns/op is one whole
// sync.
func BenchmarkSync5k(b *testing.B) {
	ctx := context.Background()
	cfg := policyConfig(map[string]string{"topology": modulePath(b, "modules/topology")},
		config.Chain{Name: "close", Match: config.Match{Namespaces: []string{"shop"}}, Modules: []config.ChainStep{{Module: "topology"}}})
	cfg.Timeout = 0 // the default 5ms, as in production
	e, _, _ := newEvaluator(b, cfg)
	const n = 5000
	svcs := make([]*model.Service, n)
	for i := range svcs {
		svcs[i] = &model.Service{Namespace: "shop", Name: fmt.Sprint("svc-", i)}
	}
	eps := endpoints("zone-a", "zone-b", "zone-c", "zone-a", "zone-b", "zone-c", "zone-a", "zone-b", "zone-c", "zone-a")
	fallbacks := 0
	sync := func(svcs []*model.Service, p model.ServicePort) {
		for _, s := range svcs {
			if v := e.Evaluate(ctx, s, p, node, eps); v.Fallback != "" {
				fallbacks++ // e.g. a deadline missed on a loaded machine
			}
		}
	}
	b.Run("nochain", func(b *testing.B) {
		other := make([]*model.Service, n)
		for i := range other {
			other[i] = &model.Service{Namespace: "other", Name: fmt.Sprint("svc-", i)}
		}
		for b.Loop() {
			sync(other, port)
		}
	})
	b.Run("cold", func(b *testing.B) {
		p := port
		fallbacks = 0
		for b.Loop() {
			p.Port++ // every input new
			sync(svcs, p)
		}
		b.ReportMetric(float64(fallbacks)/float64(b.N), "fallbacks/op")
	})
	b.Run("warm", func(b *testing.B) {
		sync(svcs, port)
		for b.Loop() {
			sync(svcs, port)
		}
	})
}

// BenchmarkShadow weighs 256 service ports of 10 endpoints (one planner
// batch) through EvaluateBatch, without and with a shadow of the topology
// step (the same module, so every answer is compared and agrees): "cold"
// has every input new, "warm" answers all from the caches. ns/op is one
// batch; the difference between the pairs is the shadow's cost.
func BenchmarkShadow(b *testing.B) {
	topo := modulePath(b, "modules/topology")
	base := policyConfig(map[string]string{"topology": topo},
		config.Chain{Name: "close", Modules: []config.ChainStep{{Module: "topology"}}})
	base.Timeout, base.ShadowBudget = 50*time.Millisecond, time.Minute // the default deadline; a budget that never cuts
	withCopy := withShadow(base, "copy", topo, "topology", nil)
	eps := endpoints("zone-a", "zone-b", "zone-c", "zone-a", "zone-b", "zone-c", "zone-a", "zone-b", "zone-c", "zone-a")
	reqs := make([]policychain.Request, 256)
	for i := range reqs {
		reqs[i] = policychain.Request{Service: &model.Service{Namespace: "shop", Name: fmt.Sprint("svc-", i)}, Port: port, Node: node, Endpoints: eps}
	}
	for _, c := range []struct {
		name string
		cfg  config.Policy
	}{{"none", base}, {"shadow", withCopy}} {
		e, _, _ := newEvaluator(b, c.cfg)
		b.Run(c.name+"/cold", func(b *testing.B) {
			for b.Loop() {
				for i := range reqs {
					reqs[i].Port.Port++ // every input new
				}
				e.EvaluateBatch(context.Background(), reqs)
			}
		})
		b.Run(c.name+"/warm", func(b *testing.B) {
			e.EvaluateBatch(context.Background(), reqs)
			for b.Loop() {
				e.EvaluateBatch(context.Background(), reqs)
			}
		})
	}
}
