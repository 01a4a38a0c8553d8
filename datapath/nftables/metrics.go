package nftables

import (
	"fmt"
	"reflect"

	"github.com/google/nftables"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
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
	MetricSyncBytes       = "edgeproxy_nftables_sync_bytes"
	MetricTamperUnknown   = "edgeproxy_nftables_tamper_unknown_total"
	MetricEventLosses     = "edgeproxy_nftables_event_losses_total"
)

type metrics struct {
	fullDuration, partialDuration prometheus.Histogram
	failures                      prometheus.Counter
	overruns                      prometheus.Counter
	ops                           prometheus.Gauge
	bytes                         prometheus.Gauge
	tamperUnknown                 prometheus.Counter
	eventLosses                   prometheus.Counter
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
		bytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: MetricSyncBytes, Help: "Bytes of netlink messages the last apply's transactions sent to the kernel."}),
		tamperUnknown: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricTamperUnknown, Help: "Tamper checks that found nf_tables events lost while someone else committed, and so had the tables rewritten."}),
		eventLosses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricEventLosses, Help: "Times the watch of nf_tables events lost some (its bounded receive buffer overran); Tampered then judges the gap."}),
		chains: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: MetricChains, Help: "Chains in edgeproxy's nftables table, per family (ip, ip6)."}, []string{"family"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.fullDuration, m.partialDuration, m.failures, m.overruns, m.ops, m.bytes, m.tamperUnknown, m.eventLosses, m.chains} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("nftables: register metrics: %w", err)
			}
		}
	}
	return m, nil
}

// queuedBytes is the size of the transaction queued on c, as Flush will
// send it: each message (a netlink header and its payload, padded to 4
// bytes) and the batch's begin and end messages. google/nftables keeps
// the queue to itself; reflection reads the lengths of its messages
// (nothing is written). Should a newer google/nftables rename them, it
// returns 0, and TestSyncBytes fails.
func queuedBytes(c *nftables.Conn) int {
	v := reflect.ValueOf(c).Elem().FieldByName("messages")
	if !v.IsValid() || v.Kind() != reflect.Slice || v.Len() == 0 {
		return 0
	}
	n := 2 * (unix.NLMSG_HDRLEN + 4) // NFNL_MSG_BATCH_BEGIN and _END, each a nfgenmsg
	for i := range v.Len() {
		d := v.Index(i).FieldByName("Data")
		if !d.IsValid() || d.Kind() != reflect.Slice {
			return 0
		}
		n += unix.NLMSG_HDRLEN + (d.Len()+unix.NLMSG_ALIGNTO-1)&^(unix.NLMSG_ALIGNTO-1)
	}
	return n
}
