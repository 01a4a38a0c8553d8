package ipvs

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric names; kube-proxy's where the meaning is the same.
const (
	MetricFullDuration    = "kubeproxy_sync_full_proxy_rules_duration_seconds"
	MetricPartialDuration = "kubeproxy_sync_partial_proxy_rules_duration_seconds"
	MetricVirtualServers  = "edgeproxy_ipvs_virtual_servers"
	MetricDraining        = "edgeproxy_ipvs_real_servers_draining"
	MetricOperations      = "edgeproxy_ipvs_sync_netlink_operations"
	MetricSyncFailures    = "edgeproxy_ipvs_sync_failures_total"
)

type metrics struct {
	fullDuration, partialDuration prometheus.Histogram
	virtualServers, draining, ops prometheus.Gauge
	failures                      prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	buckets := prometheus.ExponentialBuckets(0.001, 2, 15)
	m := &metrics{
		fullDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: MetricFullDuration, Help: "Duration of full IPVS syncs.", Buckets: buckets}),
		partialDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: MetricPartialDuration, Help: "Duration of partial IPVS syncs.", Buckets: buckets}),
		virtualServers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: MetricVirtualServers, Help: "IPVS virtual servers edgeproxy has programmed."}),
		draining: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: MetricDraining, Help: "Real servers at weight 0 waiting for their connections to end."}),
		ops: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: MetricOperations, Help: "Netlink operations (changes and dumps) of the last sync."}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricSyncFailures, Help: "IPVS syncs that returned an error."}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.fullDuration, m.partialDuration, m.virtualServers, m.draining, m.ops, m.failures} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("ipvs: register metrics: %w", err)
			}
		}
	}
	return m, nil
}
