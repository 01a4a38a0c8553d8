package agent

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/planner"
	"github.com/edgeproxy/edgeproxy/agent/policychain"
	"github.com/edgeproxy/edgeproxy/policy"
)

// chainPolicy adapts the Wasm chain evaluator to the planner.
type chainPolicy struct{ ev *policychain.Evaluator }

func newChainPolicy(ctx context.Context, cfg *config.Config, log *slog.Logger, reg prometheus.Registerer) (*chainPolicy, error) {
	// Compiled modules are cached under stateDir. A stateDir that can never
	// be a directory is refused here, by name, before the evaluator's first
	// load, whose failure would be logged as a refused reload.
	if len(cfg.Policy.Modules) > 0 && cfg.StateDir != "" && cfg.Policy.Engine != policy.Interpreter {
		if why := policy.DirProblem(cfg.StateDir); why != nil {
			return nil, fmt.Errorf("stateDir %s (compiled modules are cached under it): %w", cfg.StateDir, why)
		}
	}
	ev, err := policychain.New(ctx, cfg.Policy, cfg.StateDir, log, reg,
		policychain.WithServiceKeyPrefix(cfg.ServiceKeyPrefix), policychain.WithNodeLabels(cfg.NodeLabels))
	if err != nil {
		return nil, err
	}
	return &chainPolicy{ev: ev}, nil
}

// Weigh evaluates every request in one go, so that each chain step calls
// its module in batches.
func (p *chainPolicy) Weigh(ctx context.Context, reqs []planner.Request) []planner.Weighing {
	creqs := make([]policychain.Request, len(reqs))
	for i, r := range reqs {
		creqs[i] = policychain.Request(r)
	}
	out := make([]planner.Weighing, len(reqs))
	for i, v := range p.ev.EvaluateBatch(ctx, creqs) {
		out[i] = planner.Weighing{Weights: v.Weights, Scheduler: v.Scheduler, SchedulerFlags: v.SchedulerFlags, Retry: v.Fallback != ""}
		if v.Chain != "" {
			out[i].Explain = v
		}
	}
	return out
}

// Prepare loads and checks new chains beside the running ones; see
// policychain.Evaluator.Prepare.
func (p *chainPolicy) Prepare(ctx context.Context, cfg config.Policy) (*policychain.Swap, error) {
	return p.ev.Prepare(ctx, cfg)
}

func (p *chainPolicy) Close(ctx context.Context) error { return p.ev.Close(ctx) }

// ShadowReport is the /debug/shadow answer: the shadow modules and their
// latest differences (of service "namespace/name" when not empty).
func (p *chainPolicy) ShadowReport(service string) policychain.ShadowReport {
	return p.ev.ShadowReport(service)
}

// Modules reports each loaded module's health for /debug/status.
func (p *chainPolicy) Modules() []policychain.ModuleStatus { return p.ev.Modules() }
