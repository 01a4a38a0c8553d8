package policychain_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/agent/policychain"
)

// How the sync loop uses an Evaluator. (Not run: it needs built modules.)
func Example() {
	ctx := context.Background()
	cfg := config.Default()
	cfg.Policy.Modules = []config.Module{{Name: "topology", Path: "/etc/edgeproxy/modules/topology.wasm"}}
	cfg.Policy.Chains = []config.Chain{{
		Name: "close", Match: config.Match{Namespaces: []string{"shop"}},
		Modules: []config.ChainStep{{Module: "topology", Config: map[string]any{"minEndpoints": 2}}},
	}}
	e, err := policychain.New(ctx, cfg.Policy, cfg.StateDir, slog.Default(), prometheus.DefaultRegisterer,
		policychain.WithServiceKeyPrefix(cfg.ServiceKeyPrefix), policychain.WithNodeLabels(cfg.NodeLabels))
	if err != nil {
		fmt.Println(err) // some module failed its checks
		return
	}
	defer e.Close(ctx)

	var svc *model.Service       // from the snapshot
	var node *model.Node         // this node
	var eps []model.PortEndpoint // after built-in selection
	for _, port := range svc.Ports {
		v := e.Evaluate(ctx, svc, port, node, eps)
		for i, w := range v.Weights {
			_ = eps[i] // weight w (0: leave the endpoint out of the plan)
			_ = w
		}
		_ = v.Scheduler // Frontend.Scheduler, v.SchedulerFlags
		fmt.Println(v)  // the explain view
	}
}
