package agent

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/chain"
	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/agent/planner"
)

// chainPolicy adapts the Wasm chain evaluator to the planner.
type chainPolicy struct{ ev *chain.Evaluator }

func newChainPolicy(ctx context.Context, cfg *config.Config, log *slog.Logger, reg prometheus.Registerer) (*chainPolicy, error) {
	ev, err := chain.New(ctx, cfg.Policy, cfg.StateDir, log.With("component", "policy"), reg,
		chain.WithServiceKeyPrefix(cfg.ServiceKeyPrefix), chain.WithNodeLabels(cfg.NodeLabels))
	if err != nil {
		return nil, err
	}
	return &chainPolicy{ev: ev}, nil
}

func (p *chainPolicy) Weigh(ctx context.Context, svc *model.Service, port model.ServicePort, node *model.Node, eps []model.PortEndpoint) planner.Weighing {
	v := p.ev.Evaluate(ctx, svc, port, node, eps)
	w := planner.Weighing{Weights: v.Weights, Scheduler: v.Scheduler, SchedulerFlags: v.SchedulerFlags, Retry: v.Fallback != ""}
	if v.Chain != "" {
		w.Explain = v
	}
	return w
}

func (p *chainPolicy) Reload(ctx context.Context, cfg config.Policy) error {
	return p.ev.Reload(ctx, cfg)
}

func (p *chainPolicy) Close(ctx context.Context) error { return p.ev.Close(ctx) }

// Modules reports each loaded module's health for /debug/status.
func (p *chainPolicy) Modules() []chain.ModuleStatus { return p.ev.Modules() }
