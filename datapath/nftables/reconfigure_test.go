package nftables

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// Reconfigure makes the next apply rewrite the tables with the new
// settings, even a plan that changes nothing; a value New refuses is
// refused and changes nothing.
func TestReconfigure(t *testing.T) {
	kernel(t)
	ns := netns.New(t, "nftreconf")
	o := Options{ClusterCIDRs: []netip.Prefix{clusterCIDR}}
	p := newProxier(t, ns, o)
	plan := detectPlan(nil)
	if err := p.Apply(context.Background(), plan); err != nil {
		t.Fatal(err)
	}
	before := listOurs(t, ns, "ip")
	if !strings.Contains(before, "ip daddr 10.96.0.10 ip saddr != 10.244.0.0/16 meta mark set meta mark | 0x00004000") {
		t.Fatalf("the first ruleset:\n%s", before)
	}
	if err := p.Reconfigure(Options{MasqueradeBit: 40}); err == nil {
		t.Fatal("masquerade bit 40 accepted")
	}
	quiet := detectPlan(nil)
	quiet.Generation, quiet.Full = 2, false
	if err := p.Apply(context.Background(), quiet); err != nil {
		t.Fatal(err)
	}
	if st := p.LastStats(); st.Rebuilt || listOurs(t, ns, "ip") != before {
		t.Fatalf("a refused Reconfigure changed the tables (stats %+v)", st)
	}

	if err := p.Reconfigure(Options{MasqueradeBit: 12, MasqueradeAll: true, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.250.0.0/16")}}); err != nil {
		t.Fatal(err)
	}
	quiet.Generation = 3
	if err := p.Apply(context.Background(), quiet); err != nil {
		t.Fatal(err)
	}
	got := listOurs(t, ns, "ip")
	if st := p.LastStats(); !st.Rebuilt {
		t.Fatalf("the apply after Reconfigure did not rewrite the tables: %+v", st)
	}
	for _, want := range []string{"ip daddr 10.96.0.10 meta mark set meta mark | 0x00001000", "ip saddr 10.250.0.0/16 goto svc-default/web", "meta mark & 0x00001000"} {
		if !strings.Contains(got, want) {
			t.Errorf("after Reconfigure the table lacks %q", want)
		}
	}
	if strings.Contains(got, "0x00004000") || strings.Contains(got, "10.244.0.0/16") {
		t.Errorf("after Reconfigure the old mark or clusterCIDR is left:\n%s", got)
	}
}
