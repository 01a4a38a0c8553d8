package iptables

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric names; kube-proxy's where the meaning is the same.
const (
	MetricRules           = "kubeproxy_sync_proxy_rules_iptables_total"
	MetricRestoreFailures = "kubeproxy_sync_proxy_rules_iptables_restore_failures_total"
	MetricPartialFailures = "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total"
	MetricFullDuration    = "kubeproxy_sync_full_proxy_rules_duration_seconds"
	MetricPartialDuration = "kubeproxy_sync_partial_proxy_rules_duration_seconds"
	MetricRestoreBytes    = "edgeproxy_iptables_restore_bytes"
)

type metrics struct {
	rules           *prometheus.GaugeVec
	restoreFailures prometheus.Counter
	partialFailures prometheus.Counter
	fullDuration    prometheus.Histogram
	partialDuration prometheus.Histogram
	restoreBytes    prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	buckets := prometheus.ExponentialBuckets(0.001, 2, 15)
	m := &metrics{
		rules: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: MetricRules, Help: "Number of iptables rules edgeproxy has programmed, per table.",
		}, []string{"table"}),
		restoreFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricRestoreFailures, Help: "iptables-restore runs that failed.",
		}),
		partialFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricPartialFailures, Help: "iptables-restore runs of partial syncs that failed.",
		}),
		fullDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: MetricFullDuration, Help: "Duration of full syncs of the iptables rules.", Buckets: buckets,
		}),
		partialDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: MetricPartialDuration, Help: "Duration of partial syncs of the iptables rules.", Buckets: buckets,
		}),
		restoreBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: MetricRestoreBytes, Help: "Size of the last iptables-restore input.",
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.rules, m.restoreFailures, m.partialFailures, m.fullDuration, m.partialDuration, m.restoreBytes} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("iptables: register metrics: %w", err)
			}
		}
	}
	return m, nil
}
