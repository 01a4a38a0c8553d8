package policychain

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	calls     *prometheus.CounterVec
	cacheHits *prometheus.CounterVec
	failures  *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	fallbacks *prometheus.CounterVec
	reloads   *prometheus.CounterVec

	shadowCompared *prometheus.CounterVec
	shadowDiffs    *prometheus.CounterVec
	shadowFailures *prometheus.CounterVec
}

func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		calls: counterVec("edgeproxy_policy_module_calls_total",
			"Evaluations asked of a policy module, answered from the cache or not.", "module"),
		cacheHits: counterVec("edgeproxy_policy_module_cache_hits_total",
			"Evaluations answered from the module's result cache (unchanged input).", "module"),
		failures: counterVec("edgeproxy_policy_module_failures_total",
			"Failed evaluations by reason: trap, timeout, invalid, circuit_open.", "module", "reason"),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "edgeproxy_policy_module_evaluation_seconds",
			Help:    "Time of one module call, host-guest copies included (cache hits excluded).",
			Buckets: prometheus.ExponentialBuckets(2e-6, 2.5, 12), // 2µs .. ~50ms
		}, []string{"module"}),
		fallbacks: counterVec("edgeproxy_policy_fallbacks_total",
			"Chain evaluations where a module failed and the chain's failure policy was applied.", "chain", "policy"),
		reloads: counterVec("edgeproxy_policy_reloads_total",
			"Policy (re)loads by result; on failure the previous chains keep running.", "result"),
		shadowCompared: counterVec("edgeproxy_policy_shadow_compared_total",
			"Answers of a shadow module compared with those of the module it shadows (a repeated input counts once).", "module"),
		shadowDiffs: counterVec("edgeproxy_policy_shadow_diff_total",
			"Compared answers of a shadow module that differ from the shadowed module's (weights or scheduler).", "module"),
		shadowFailures: counterVec("edgeproxy_policy_shadow_failures_total",
			"Failed shadow evaluations by reason: trap, timeout, invalid, circuit_open, skipped (the sync's shadow budget was spent), load. They never affect traffic.",
			"module", "reason"),
	}
	if reg == nil {
		return m, nil
	}
	counters := []**prometheus.CounterVec{&m.calls, &m.cacheHits, &m.failures, &m.fallbacks, &m.reloads,
		&m.shadowCompared, &m.shadowDiffs, &m.shadowFailures}
	for _, c := range counters {
		if err := reg.Register(*c); err != nil {
			existing, err := shared[*prometheus.CounterVec](err)
			if err != nil {
				return nil, err
			}
			*c = existing
		}
	}
	if err := reg.Register(m.duration); err != nil {
		existing, err := shared[*prometheus.HistogramVec](err)
		if err != nil {
			return nil, err
		}
		m.duration = existing
	}
	return m, nil
}

// shared returns the collector already registered when err says so: a
// second Evaluator on the same registry shares the series.
func shared[T prometheus.Collector](err error) (T, error) {
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(T); ok {
			return existing, nil
		}
	}
	var zero T
	return zero, err
}
