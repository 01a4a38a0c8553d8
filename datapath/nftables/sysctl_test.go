package nftables

import (
	"testing"

	"github.com/edgeproxy/edgeproxy/datapath/sysctl"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// TestSysctls: the mode turns forwarding on in the namespace it programs,
// as the iptables mode does: IPv4 always, IPv6 when it proxies IPv6 and
// KeepIPv6Forwarding is off; a Reconfigure that lets go of
// KeepIPv6Forwarding turns IPv6 forwarding on. The test's own namespace
// is left alone.
func TestSysctls(t *testing.T) {
	kernel(t)
	const v4, v6 = "net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"
	get := func(ns *netns.NS, k string) string {
		t.Helper()
		var got string
		if err := ns.Do(func() (err error) { got, err = sysctl.Get(k); return err }); err != nil {
			t.Fatal(err)
		}
		return got
	}
	for _, tc := range []struct {
		name                   string
		ipv6, keep6, noSysctls bool
		want4, want6           string
	}{
		{"ipv4 only", false, false, false, "1", "0"},
		{"dual-stack", true, false, false, "1", "1"},
		{"dual-stack, IPv6 forwarding kept", true, true, false, "1", "0"},
		{"only to find or remove the tables", true, false, true, "0", "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := netns.New(t, "nftsysctl")
			for _, k := range []string{v4, v6} {
				if err := ns.Sysctl(k, "0"); err != nil {
					t.Fatal(err)
				}
			}
			p := newProxier(t, ns, Options{IPv6: tc.ipv6, KeepIPv6Forwarding: tc.keep6, NoSysctls: tc.noSysctls})
			if err := p.SysctlErrors(); err != nil {
				t.Fatal(err)
			}
			if got := get(ns, v4); got != tc.want4 {
				t.Errorf("%s = %s, want %s", v4, got, tc.want4)
			}
			if got := get(ns, v6); got != tc.want6 {
				t.Errorf("%s = %s, want %s", v6, got, tc.want6)
			}
			if !tc.keep6 {
				return
			}
			o := p.opts
			o.KeepIPv6Forwarding = false
			if err := p.Reconfigure(o); err != nil {
				t.Fatal(err)
			}
			if got := get(ns, v6); got != "1" {
				t.Errorf("%s = %s after Reconfigure without KeepIPv6Forwarding, want 1", v6, got)
			}
		})
	}
}
