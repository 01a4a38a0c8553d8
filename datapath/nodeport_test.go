package datapath

import (
	"net/netip"
	"slices"
	"testing"
)

func TestNodePortIPs(t *testing.T) {
	a, p := netip.MustParseAddr, netip.MustParsePrefix
	local := func() ([]netip.Addr, error) {
		return []netip.Addr{a("127.0.0.1"), a("192.168.77.1"), a("10.244.0.1"), a("10.0.0.7"), a("::1"), a("fd00:77::1")}, nil
	}
	for _, tc := range []struct {
		name    string
		fam     Family
		npa     []netip.Prefix
		primary bool
		nodeIPs []netip.Addr
		want    []netip.Addr
	}{
		{"nothing set: every local address", IPv4, nil, false, nil, nil},
		// The node's addresses in the range, not the range itself.
		{"a CIDR", IPv4, []netip.Prefix{p("192.168.77.0/24")}, false, nil, []netip.Addr{a("192.168.77.1")}},
		{"no local address in it", IPv4, []netip.Prefix{p("172.16.0.0/12")}, false, nil, []netip.Addr{}},
		// CIDRs of one family leave the other unrestricted.
		{"only the other family", IPv6, []netip.Prefix{p("192.168.77.0/24")}, false, nil, nil},
		{"primary", IPv4, nil, true, []netip.Addr{a("10.0.0.7"), a("fd00:77::1")}, []netip.Addr{a("10.0.0.7")}},
		{"primary and a CIDR", IPv4, []netip.Prefix{p("10.244.0.0/16")}, true, []netip.Addr{a("10.0.0.7")}, []netip.Addr{a("10.0.0.7"), a("10.244.0.1")}},
		{"primary not yet known", IPv4, nil, true, nil, nil},
		{"primary IPv6", IPv6, nil, true, []netip.Addr{a("10.0.0.7"), a("fd00:77::1")}, []netip.Addr{a("fd00:77::1")}},
	} {
		got, err := NodePortIPs(tc.fam, tc.npa, tc.primary, tc.nodeIPs, local)
		if err != nil {
			t.Fatal(err)
		}
		if (got == nil) != (tc.want == nil) || !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}
