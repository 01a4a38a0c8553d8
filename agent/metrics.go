package agent

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/source"
	"github.com/edgeproxy/edgeproxy/agent/state"
	"github.com/edgeproxy/edgeproxy/datapath"
)

// metrics uses kube-proxy's names where the meaning is the same, so existing
// dashboards and alerts keep working.
type metrics struct {
	syncDuration          prometheus.Histogram
	programming           prometheus.Histogram
	lastSync              prometheus.Gauge
	lastQueued            prometheus.Gauge
	syncErrors            prometheus.Counter
	snapshotWriteFailures prometheus.Counter
	frontends             prometheus.Gauge
	generation            prometheus.Gauge
	portsEvaluated        prometheus.Counter
	apiserverContact      prometheus.GaugeFunc
	tamperedRepairs       prometheus.Counter
	quietCompares         prometheus.Counter
	healthz, livez        *prometheus.CounterVec // by HTTP status code
	// noLocalEndpoints: service ports whose Local traffic policy leaves
	// this node without endpoints, by traffic_policy and ip_family.
	noLocalEndpoints *prometheus.GaugeVec

	externalIPsIgnored prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, st *state.State, lastContact, snapshotAge func() float64) *metrics {
	m := &metrics{
		syncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kubeproxy_sync_proxy_rules_duration_seconds",
			Help:    "How long one sync took: snapshot, selection, policy, and programming the datapath.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}),
		programming: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kubeproxy_network_programming_duration_seconds",
			Help:    "From the change of an EndpointSlice (its last-change-trigger-time) until the datapath was programmed.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 20),
		}),
		lastSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
			Help: "The last time the datapath was programmed successfully.",
		}),
		lastQueued: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
			Help: "The last time a change was queued for a sync.",
		}),
		syncErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeproxy_sync_errors_total",
			Help: "Syncs whose datapath apply failed; the next sync is a full one.",
		}),
		frontends: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeproxy_plan_frontends",
			Help: "Frontends in the last plan applied.",
		}),
		generation: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeproxy_plan_generation",
			Help: "Generation of the last plan applied.",
		}),
		portsEvaluated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeproxy_sync_ports_evaluated_total",
			Help: "Service ports recomputed by syncs (unchanged ports are reused).",
		}),
		tamperedRepairs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeproxy_datapath_tampered_total",
			Help: "Times the datapath found its kernel objects changed behind its back and a full sync was forced.",
		}),
		quietCompares: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeproxy_sync_quiet_compares_total",
			Help: "Periodic full compares (sync.period) skipped because neither the state nor the kernel's tables moved since the last one.",
		}),
		healthz: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeproxy_proxy_healthz_total",
			Help: "/healthz answers by HTTP status code.",
		}, []string{"code"}),
		livez: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeproxy_proxy_livez_total",
			Help: "/livez answers by HTTP status code.",
		}, []string{"code"}),
		noLocalEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
			Help: "Service ports with a Local traffic policy and endpoints, none of them on this node (their traffic is dropped).",
		}, []string{"traffic_policy", "ip_family"}),
		externalIPsIgnored: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeproxy_external_ips_ignored_total",
			Help: "Services found with spec.externalIPs while externalIPs is off (each counted once until it drops them).",
		}),
		snapshotWriteFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeproxy_snapshot_write_failures_total",
			Help: "Snapshot writes that failed (full disk, read-only state directory); the previous snapshot stays.",
		}),
		apiserverContact: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "edgeproxy_apiserver_last_contact_seconds",
			Help: "Seconds since the API server last delivered anything (list or watch event); -1 when never, 0 with a manifest source.",
		}, lastContact),
	}
	reg.MustRegister(m.syncDuration, m.programming, m.lastSync, m.lastQueued, m.syncErrors,
		m.frontends, m.generation, m.portsEvaluated, m.tamperedRepairs, m.quietCompares, m.apiserverContact, m.healthz, m.livez, m.externalIPsIgnored, m.noLocalEndpoints, m.snapshotWriteFailures)
	registerStateMetrics(reg, st, snapshotAge)
	return m
}

// registerLinkMetrics registers what the link to the API server moved
// and asked for (source.Link.Usage), read when scraped.
func registerLinkMetrics(reg prometheus.Registerer, link *source.Link) {
	u := func(f func(source.LinkUsage) int64) func() float64 {
		return func() float64 { return float64(f(link.Usage())) }
	}
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "edgeproxy_apiserver_bytes_total",
			Help:        "Bytes read from (in) and written to (out) the connections to the API server: TLS records, without TCP/IP headers.",
			ConstLabels: prometheus.Labels{"direction": "in"},
		}, u(func(l source.LinkUsage) int64 { return l.BytesIn })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "edgeproxy_apiserver_bytes_total",
			Help:        "Bytes read from (in) and written to (out) the connections to the API server: TLS records, without TCP/IP headers.",
			ConstLabels: prometheus.Labels{"direction": "out"},
		}, u(func(l source.LinkUsage) int64 { return l.BytesOut })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "edgeproxy_apiserver_reads_total",
			Help:        "Reads of Services, EndpointSlices and the Node: full lists (at the start, after 410 Gone) and watches (each from the resourceVersion the agent had).",
			ConstLabels: prometheus.Labels{"kind": "list"},
		}, u(func(l source.LinkUsage) int64 { return l.Lists })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "edgeproxy_apiserver_reads_total",
			Help:        "Reads of Services, EndpointSlices and the Node: full lists (at the start, after 410 Gone) and watches (each from the resourceVersion the agent had).",
			ConstLabels: prometheus.Labels{"kind": "watch"},
		}, u(func(l source.LinkUsage) int64 { return l.Watches })),
	)
}

// registerStateMetrics registers the metrics read from the state and the
// snapshot when scraped: change counters and pending changes (kube-proxy's
// names), and the snapshot's age.
func registerStateMetrics(reg prometheus.Registerer, st *state.State, snapshotAge func() float64) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "edgeproxy_snapshot_age_seconds",
			Help: "Age of the last known state on disk (written, or loaded at an offline start); -1 when none.",
		}, snapshotAge),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "kubeproxy_sync_proxy_rules_service_changes_total",
			Help: "Service changes that reached the proxy (no-op updates excluded).",
		}, func() float64 { return float64(st.Counters().ServiceChanges) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "kubeproxy_sync_proxy_rules_endpoint_changes_total",
			Help: "EndpointSlice changes that reached the proxy (no-op updates excluded).",
		}, func() float64 { return float64(st.Counters().EndpointChanges) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kubeproxy_sync_proxy_rules_service_changes_pending",
			Help: "Services with Service changes not yet synced.",
		}, func() float64 { return float64(st.Counters().ServicesPending) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
			Help: "Services with EndpointSlice changes not yet synced.",
		}, func() float64 { return float64(st.Counters().EndpointsPending) }),
	)
}

// setNoLocalEndpoints counts, per traffic policy and family, the service
// ports a Local policy leaves without endpoints here (Frontend.Drop), as
// kube-proxy's sync_proxy_rules_no_local_endpoints_total.
func (m *metrics) setNoLocalEndpoints(frontends []datapath.Frontend) {
	type key struct {
		service datapath.ServicePortName
		proto   datapath.Protocol
		policy  string
		fam     datapath.Family
	}
	seen := map[key]bool{}
	for i := range frontends {
		f := &frontends[i]
		if !f.Drop {
			continue
		}
		policy := "internal"
		if f.Kind.External() {
			policy = "external"
		}
		seen[key{f.Service, f.Protocol, policy, f.Family}] = true
	}
	for _, policy := range []string{"internal", "external"} {
		for _, fam := range []datapath.Family{datapath.IPv4, datapath.IPv6} {
			n := 0
			for k := range seen {
				if k.policy == policy && k.fam == fam {
					n++
				}
			}
			m.noLocalEndpoints.WithLabelValues(policy, fmt.Sprintf("IPv%d", fam)).Set(float64(n))
		}
	}
}
