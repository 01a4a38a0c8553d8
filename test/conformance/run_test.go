package conformance

import "testing"

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
		if got := familiesSynced(c.metrics, "IPv4", "IPv6"); got != c.want {
			t.Errorf("%s: familiesSynced = %t, want %t", c.name, got, c.want)
		}
	}
}
