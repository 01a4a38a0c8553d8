package agent

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/state"
)

// metrics uses kube-proxy's names where the meaning is the same, so existing
// dashboards and alerts keep working.
type metrics struct {
	syncDuration     prometheus.Histogram
	programming      prometheus.Histogram
	lastSync         prometheus.Gauge
	lastQueued       prometheus.Gauge
	syncErrors       prometheus.Counter
	frontends        prometheus.Gauge
	generation       prometheus.Gauge
	portsEvaluated   prometheus.Counter
	apiserverContact prometheus.GaugeFunc
	tamperedRepairs  prometheus.Counter
	healthz, livez   *prometheus.CounterVec // by HTTP status code

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
		healthz: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeproxy_proxy_healthz_total",
			Help: "/healthz answers by HTTP status code.",
		}, []string{"code"}),
		livez: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeproxy_proxy_livez_total",
			Help: "/livez answers by HTTP status code.",
		}, []string{"code"}),
		externalIPsIgnored: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgeproxy_external_ips_ignored_total",
			Help: "Services found with spec.externalIPs while externalIPs is off (each counted once until it drops them).",
		}),
		apiserverContact: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "edgeproxy_apiserver_last_contact_seconds",
			Help: "Seconds since the API server last delivered anything (list or watch event); -1 when never, 0 with a manifest source.",
		}, lastContact),
	}
	reg.MustRegister(m.syncDuration, m.programming, m.lastSync, m.lastQueued, m.syncErrors,
		m.frontends, m.generation, m.portsEvaluated, m.tamperedRepairs, m.apiserverContact, m.healthz, m.livez, m.externalIPsIgnored,
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
	)
	return m
}
