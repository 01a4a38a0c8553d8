package chain_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/model"
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
