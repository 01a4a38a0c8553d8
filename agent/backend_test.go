package agent

import (
	"net/netip"
	"testing"
)

// IPv6 follows the node's addresses, as kube-proxy's dual-stack proxier
// does, not only an IPv6 clusterCIDR.
func TestWantIPv6(t *testing.T) {
	a, p := netip.MustParseAddr, netip.MustParsePrefix
	for _, tc := range []struct {
		name  string
		cidrs []netip.Prefix
		addrs []netip.Addr
		want  bool
	}{
		{"IPv4 only", []netip.Prefix{p("10.244.0.0/16")}, []netip.Addr{a("192.168.1.2"), a("127.0.0.1"), a("::1"), a("fe80::1")}, false},
		{"node has a global IPv6 address", []netip.Prefix{p("10.244.0.0/16")}, []netip.Addr{a("192.168.1.2"), a("fd00:77::1")}, true},
		{"no clusterCIDR, IPv6 address", nil, []netip.Addr{a("2001:db8::5")}, true},
		{"IPv6 clusterCIDR", []netip.Prefix{p("fd00:244::/56")}, nil, true},
	} {
		if got := wantIPv6(tc.cidrs, tc.addrs); got != tc.want {
			t.Errorf("%s: wantIPv6 = %v, want %v", tc.name, got, tc.want)
		}
	}
}
