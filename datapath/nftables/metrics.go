package nftables

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric names; kube-proxy's where the meaning is the same (its nftables
// mode's failure counter, the sync durations every mode shares).
const (
	MetricFullDuration    = "kubeproxy_sync_full_proxy_rules_duration_seconds"
	MetricPartialDuration = "kubeproxy_sync_partial_proxy_rules_duration_seconds"
	MetricSyncFailures    = "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"
	MetricOperations      = "edgeproxy_nftables_sync_netlink_operations"
	MetricChains          = "edgeproxy_nftables_chains"
	MetricOverruns        = "edgeproxy_nftables_receive_overruns_total"
	MetricTamperUnknown   = "edgeproxy_nftables_tamper_unknown_total"
)

type metrics struct {
	fullDuration, partialDuration prometheus.Histogram
	failures                      prometheus.Counter
	overruns                      prometheus.Counter
	ops                           prometheus.Gauge
	tamperUnknown                 prometheus.Counter
	chains                        *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	buckets := prometheus.ExponentialBuckets(0.001, 2, 15)
	m := &metrics{
		fullDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: MetricFullDuration, Help: "Duration of the applies that wrote the nftables tables whole.", Buckets: buckets}),
		partialDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: MetricPartialDuration, Help: "Duration of the applies that sent the differences of the changed service ports.", Buckets: buckets}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricSyncFailures, Help: "nf_tables transactions of an apply that the kernel refused."}),
		overruns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricOverruns, Help: "Transactions whose answers overran the netlink socket's receive buffer (ENOBUFS) and that the ruleset generation showed committed."}),
		ops: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: MetricOperations, Help: "Operations in the last apply's transaction (a chain, a rule, a set's element list each)."}),
		tamperUnknown: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricTamperUnknown, Help: "Tamper checks that found nf_tables events lost while someone else committed, and so had the tables rewritten."}),
		chains: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: MetricChains, Help: "Chains in edgeproxy's nftables table, per family (ip, ip6)."}, []string{"family"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.fullDuration, m.partialDuration, m.failures, m.overruns, m.ops, m.tamperUnknown, m.chains} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("nftables: register metrics: %w", err)
			}
		}
	}
	return m, nil
}
