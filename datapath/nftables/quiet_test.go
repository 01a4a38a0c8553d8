package nftables

import (
	"context"
	"net/netip"
	"testing"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// Unchanged vouches for the tables only once Tampered verified them at
// the current ruleset generation, or an apply moved it by its own
// transactions only, from verified tables or writing them whole (a first
// apply): not before an apply, not after another's commit (any
// table) until Tampered looked, not while a failed apply owes a rebuild,
// and not once the node-port addresses looked up now differ from those
// written.
func TestUnchanged(t *testing.T) {
	kernel(t)
	ns := netns.New(t, "nftquiet")
	ctx := context.Background()
	web := svcName("default", "web", "")
	ep := func(s string) datapath.Endpoint {
		return datapath.Endpoint{Addr: netip.MustParseAddrPort(s), Weight: 1}
	}
	plan := newPlan(1, clusterIP(web, datapath.TCP, "10.96.0.10", 80, ep("10.244.1.2:8080")))
	p := newProxier(t, ns, Options{ClusterCIDRs: []netip.Prefix{clusterCIDR}})
	verify := func() {
		t.Helper()
		if bad, err := p.Tampered(ctx); err != nil || bad {
			t.Fatalf("Tampered = %v, %v", bad, err)
		}
	}
	if p.Unchanged() {
		t.Fatal("Unchanged before any apply")
	}
	if err := p.Apply(ctx, plan); err != nil {
		t.Fatal(err)
	}
	if !p.Unchanged() {
		t.Fatal("not Unchanged after a first apply, which wrote the table whole")
	}
	verify()
	if !p.Unchanged() || !p.Unchanged() {
		t.Fatal("not Unchanged after a passing check")
	}
	// Our own partial apply from verified tables: the generation moved
	// by its one transaction only, so the tables stay verified.
	next := newPlan(2, clusterIP(web, datapath.TCP, "10.96.0.10", 80, ep("10.244.1.3:8080")))
	next.Full, next.Changed = false, map[datapath.ServicePortName]bool{web: true}
	if err := p.Apply(ctx, next); err != nil {
		t.Fatal(err)
	}
	if !p.Unchanged() {
		t.Fatal("our own apply from verified tables took Unchanged away")
	}
	// Another's commit before our apply: the apply does not vouch for it.
	if _, err := ns.Run("nft", "add", "table", "ip", "someone-before"); err != nil {
		t.Fatal(err)
	}
	back := newPlan(3, clusterIP(web, datapath.TCP, "10.96.0.10", 80, ep("10.244.1.2:8080")))
	back.Full, back.Changed = false, map[datapath.ServicePortName]bool{web: true}
	if err := p.Apply(ctx, back); err != nil {
		t.Fatal(err)
	}
	if p.Unchanged() {
		t.Fatal("Unchanged right after our apply on top of a commit nobody looked at")
	}
	verify()
	// A compare that finds nothing to send commits nothing.
	same := newPlan(4, clusterIP(web, datapath.TCP, "10.96.0.10", 80, ep("10.244.1.2:8080")))
	if err := p.Apply(ctx, same); err != nil {
		t.Fatal(err)
	}
	if !p.Unchanged() {
		t.Fatal("an apply that sent nothing took Unchanged away")
	}
	// Anyone's commit, even of another table, needs a look.
	if _, err := ns.Run("nft", "add", "table", "ip", "someone-else"); err != nil {
		t.Fatal(err)
	}
	if p.Unchanged() {
		t.Fatal("Unchanged across another's commit")
	}
	verify()
	if !p.Unchanged() {
		t.Fatal("not Unchanged after the look found our table intact")
	}
	// A hand-made change: Tampered owes a rebuild, and Unchanged says no
	// until it is done and looked at.
	if _, err := ns.Run("nft", "add", "chain", "ip", TableName, "intruder"); err != nil {
		t.Fatal(err)
	}
	if bad, err := p.Tampered(ctx); err != nil || !bad {
		t.Fatalf("Tampered = %v, %v, want the hand-made chain seen", bad, err)
	}
	if p.Unchanged() {
		t.Fatal("Unchanged while a rebuild is owed")
	}
	same.Generation = 5
	if err := p.Apply(ctx, same); err != nil {
		t.Fatal(err)
	}
	verify()
	if !p.Unchanged() {
		t.Fatal("not Unchanged after the rebuild was looked at")
	}

	// Node ports restricted to the node's addresses: Unchanged while the
	// addresses looked up now are those written, not once they moved.
	ns2 := netns.New(t, "nftquiet2")
	local := []netip.Addr{netip.MustParseAddr("192.0.2.1")}
	during := func() {} // runs inside each look-up of the node's addresses
	q := newProxier(t, ns2, Options{ClusterCIDRs: []netip.Prefix{clusterCIDR}, NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")},
		LocalAddrs: func() ([]netip.Addr, error) { during(); return local, nil }})
	np := newPlan(1, nodePort(web, datapath.TCP, datapath.IPv4, 30080, ep("10.244.1.3:8080")))
	if err := q.Apply(ctx, np); err != nil {
		t.Fatal(err)
	}
	if bad, err := q.Tampered(ctx); err != nil || bad {
		t.Fatalf("Tampered = %v, %v", bad, err)
	}
	if !q.Unchanged() {
		t.Fatal("not Unchanged with the node-port addresses as written")
	}
	local = []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.7")}
	if q.Unchanged() {
		t.Fatal("Unchanged after the node gained a node-port address")
	}
	// Another's commit while an apply renders (here, from inside the
	// apply's look-up of the node's addresses) is not taken for one of
	// the apply's own: the apply does not vouch for the tables, and the
	// look finds the hand-made chain.
	local = local[:1]
	during = func() {
		during = func() {}
		if _, err := ns2.Run("nft", "add", "chain", "ip", TableName, "intruder"); err != nil {
			t.Error(err)
		}
	}
	np2 := newPlan(2, nodePort(web, datapath.TCP, datapath.IPv4, 30080, ep("10.244.1.4:8080")))
	np2.Full, np2.Changed = false, map[datapath.ServicePortName]bool{web: true}
	if err := q.Apply(ctx, np2); err != nil {
		t.Fatal(err)
	}
	if q.Unchanged() {
		t.Fatal("Unchanged after an apply during which someone else added a chain to our table")
	}
	if bad, err := q.Tampered(ctx); err != nil || !bad {
		t.Fatalf("Tampered = %v, %v, want the chain added during the apply seen", bad, err)
	}
	// The Node's primary addresses (the mode's default): the same, with
	// the plan's NodeIPs.
	ns3 := netns.New(t, "nftquiet3")
	local = []netip.Addr{netip.MustParseAddr("192.0.2.1")}
	pr := newProxier(t, ns3, Options{ClusterCIDRs: []netip.Prefix{clusterCIDR}, NodePortPrimary: true,
		LocalAddrs: func() ([]netip.Addr, error) { return local, nil }})
	np.NodeIPs = []netip.Addr{netip.MustParseAddr("192.0.2.1")}
	if err := pr.Apply(ctx, np); err != nil {
		t.Fatal(err)
	}
	if bad, err := pr.Tampered(ctx); err != nil || bad {
		t.Fatalf("Tampered = %v, %v", bad, err)
	}
	if !pr.Unchanged() {
		t.Fatal("not Unchanged with the primary address as written")
	}
	local = nil // the address left the node
	if pr.Unchanged() {
		t.Fatal("Unchanged after the primary address left the node")
	}
}
