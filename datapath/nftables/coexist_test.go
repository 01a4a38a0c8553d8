package nftables

import (
	"context"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// Other tables' base chains with policy drop are named in the status
// (an inet filter table's, iptables-nft's FORWARD policy as Docker sets
// it); accepting ones, ours among them, are not.
func TestStatusWarnsOfDropPolicies(t *testing.T) {
	kernel(t)
	gate.Binaries(t, "iptables-nft")
	ns := netns.New(t, "nftcoexist")
	p := newProxier(t, ns, Options{IPv6: true})
	if err := p.Apply(context.Background(), detectPlan(nil)); err != nil {
		t.Fatal(err)
	}
	if out, err := ns.Run("nft", "add table inet other; add chain inet other accepting { type filter hook input priority 0; policy accept; }"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if w := p.Status().Warnings; len(w) != 0 {
		t.Fatalf("warnings without any drop policy: %q", w)
	}
	if out, err := ns.Run("nft", "add chain inet other forwarding { type filter hook forward priority 0; policy drop; }"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if out, err := ns.Run("iptables-nft", "-P", "FORWARD", "DROP"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	w := p.Status().Warnings
	want := []string{"table inet other chain forwarding (forward, priority 0) has policy drop", "table ip filter chain FORWARD (forward, priority 0) has policy drop"}
	if len(w) != len(want) {
		t.Fatalf("warnings %q, want %d", w, len(want))
	}
	for _, s := range want {
		if !strings.Contains(strings.Join(w, "\n"), s) {
			t.Errorf("warnings %q lack %q", w, s)
		}
	}
}
