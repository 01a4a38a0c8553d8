package chain

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

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeproxy_policy_module_calls_total",
			Help: "Evaluations asked of a policy module, answered from the cache or not.",
		}, []string{"module"}),
		cacheHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeproxy_policy_module_cache_hits_total",
			Help: "Evaluations answered from the module's result cache (unchanged input).",
		}, []string{"module"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeproxy_policy_module_failures_total",
			Help: "Failed evaluations by reason: trap, timeout, invalid, circuit_open.",
		}, []string{"module", "reason"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "edgeproxy_policy_module_evaluation_seconds",
			Help:    "Time of one module call, host-guest copies included (cache hits excluded).",
			Buckets: prometheus.ExponentialBuckets(2e-6, 2.5, 12), // 2µs .. ~50ms
		}, []string{"module"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeproxy_policy_fallbacks_total",
			Help: "Chain evaluations where a module failed and the chain's failure policy was applied.",
		}, []string{"chain", "policy"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeproxy_policy_reloads_total",
			Help: "Policy (re)loads by result; on failure the previous chains keep running.",
		}, []string{"result"}),
		shadowCompared: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeproxy_policy_shadow_compared_total",
			Help: "Answers of a shadow module compared with those of the module it shadows (a repeated input counts once).",
		}, []string{"module"}),
		shadowDiffs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeproxy_policy_shadow_diff_total",
			Help: "Compared answers of a shadow module that differ from the shadowed module's (weights or scheduler).",
		}, []string{"module"}),
		shadowFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeproxy_policy_shadow_failures_total",
			Help: "Failed shadow evaluations by reason: trap, timeout, invalid, circuit_open, skipped (the sync's shadow budget was spent), load. They never affect traffic.",
		}, []string{"module", "reason"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.calls, m.cacheHits, m.failures, m.duration, m.fallbacks, m.reloads,
		m.shadowCompared, m.shadowDiffs, m.shadowFailures} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, err
			}
			// A second Evaluator on the same registry shares the series.
			switch existing := are.ExistingCollector.(type) {
			case *prometheus.CounterVec:
				switch c {
				case m.calls:
					m.calls = existing
				case m.cacheHits:
					m.cacheHits = existing
				case m.failures:
					m.failures = existing
				case m.fallbacks:
					m.fallbacks = existing
				case m.reloads:
					m.reloads = existing
				case m.shadowCompared:
					m.shadowCompared = existing
				case m.shadowDiffs:
					m.shadowDiffs = existing
				case m.shadowFailures:
					m.shadowFailures = existing
				}
			case *prometheus.HistogramVec:
				m.duration = existing
			}
		}
	}
	return m, nil
}
