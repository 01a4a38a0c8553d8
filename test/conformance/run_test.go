package conformance

import (
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/test/proxies"
)

func TestFamiliesSynced(t *testing.T) {
	const head = "# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds [ALPHA] The last time proxy rules were successfully synced\n" +
		"# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge\n"
	for _, c := range []struct {
		name, metrics string
		want          bool
	}{
		{"both", head + "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} 1.7640271e+09\n" +
			"kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv6\"} 1.7640272e+09\n", true},
		{"IPv6 still in its first sync", head + "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} 1.7640271e+09\n", false},
		{"IPv6 zero", head + "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} 1.7640271e+09\n" +
			"kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv6\"} 0\n", false},
		{"other metric", "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family=\"IPv4\"} 1\n" +
			"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family=\"IPv6\"} 1\n", false},
		{"empty", "", false},
	} {
		if got := familiesSynced(parse(t, c.metrics), "IPv4", "IPv6"); got != c.want {
			t.Errorf("%s: familiesSynced = %t, want %t", c.name, got, c.want)
		}
	}
}

func TestParseSyncs(t *testing.T) {
	const kube = `# HELP kubeproxy_sync_proxy_rules_duration_seconds [ALPHA] SyncProxyRules latency in seconds
# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.001"} 0
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="4.096"} 3
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="8.192"} 4
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="16.384"} 4
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} 4
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family="IPv4"} 12.5
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 4
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="0.001"} 0
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="16.384"} 1
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="+Inf"} 2
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family="IPv6"} 30
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv6"} 2
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7640271e+09
`
	const edge = `kubeproxy_sync_proxy_rules_duration_seconds_bucket{le="0.001"} 1
kubeproxy_sync_proxy_rules_duration_seconds_bucket{le="0.002"} 5
kubeproxy_sync_proxy_rules_duration_seconds_bucket{le="+Inf"} 5
kubeproxy_sync_proxy_rules_duration_seconds_sum 0.0071
kubeproxy_sync_proxy_rules_duration_seconds_count 5
`
	for _, c := range []struct {
		name, metrics, family string
		want                  syncs
	}{
		{"kube-proxy IPv4: the bucket holding all", kube, "IPv4", syncs{4, 8192 * time.Millisecond}},
		{"kube-proxy IPv6: past the last bucket, the sum", kube, "IPv6", syncs{2, 30 * time.Second}},
		{"edgeproxy: one series for both", edge, "IPv6", syncs{5, 2 * time.Millisecond}},
	} {
		got, err := parseSyncs(parse(t, c.metrics), c.family)
		if err != nil || got != c.want {
			t.Errorf("%s: parseSyncs = %+v, %v; want %+v", c.name, got, err, c.want)
		}
	}
	if s, err := parseSyncs(parse(t, "kubeproxy_sync_proxy_rules_last_timestamp_seconds 1\n"), "IPv4"); err == nil {
		t.Errorf("no histogram: parseSyncs = %+v, want an error", s)
	}
}

// parse reads a metrics text as the harness reads a proxy's /metrics.
func parse(t *testing.T, text string) proxies.Metrics {
	t.Helper()
	m, err := proxies.ParseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return m
}
