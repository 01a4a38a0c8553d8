package agent

import (
	"maps"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/agent/config"
)

// The values kube-proxy's conntrack setup would write
// (cmd/kube-proxy/app/conntrack.go, pkg/proxy/conntrack/sysctls.go).
func TestConntrackSysctls(t *testing.T) {
	def := config.Default().Conntrack
	for _, tc := range []struct {
		name string
		c    config.Conntrack
		cpus int
		want map[string]string
	}{
		{"defaults, 2 CPUs: the floor", def, 2, map[string]string{
			"net/netfilter/nf_conntrack_max":                     "131072",
			"net/netfilter/nf_conntrack_tcp_timeout_established": "86400",
			"net/netfilter/nf_conntrack_tcp_timeout_close_wait":  "3600",
		}},
		{"defaults, 8 CPUs: scaled", def, 8, map[string]string{
			"net/netfilter/nf_conntrack_max":                     "262144",
			"net/netfilter/nf_conntrack_tcp_timeout_established": "86400",
			"net/netfilter/nf_conntrack_tcp_timeout_close_wait":  "3600",
		}},
		{"capped", config.Conntrack{MaxPerCore: 1 << 20, Min: 1 << 22}, 4, map[string]string{
			"net/netfilter/nf_conntrack_max": "1048576",
		}},
		{"all zero: nothing", config.Conntrack{}, 4, map[string]string{}},
		{"udp and liberal", config.Conntrack{UDPTimeout: 30 * time.Second, UDPStreamTimeout: 2 * time.Minute, TCPBeLiberal: true}, 4, map[string]string{
			"net/netfilter/nf_conntrack_udp_timeout":        "30",
			"net/netfilter/nf_conntrack_udp_timeout_stream": "120",
			"net/netfilter/nf_conntrack_tcp_be_liberal":     "1",
		}},
	} {
		if got := conntrackSysctls(tc.c, tc.cpus); !maps.Equal(got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}
