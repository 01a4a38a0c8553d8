package nftables

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// A cold start (no table of ours in the kernel) is sent in bounded
// transactions and leaves the table that one transaction over an
// existing table writes; one that fails half-way leaves a table no hook
// leads into, and the next apply writes it whole.
func TestColdStartInParts(t *testing.T) {
	kernel(t)
	ctx := context.Background()
	o := Options{ClusterCIDRs: []netip.Prefix{clusterCIDR, clusterCIDR6}, IPv6: true}
	r := rand.New(rand.NewPCG(27, 5))
	a, b := netns.New(t, "nftcold"), netns.New(t, "nftcoldref")
	for step := range 10 {
		plan := randomPlan(r, 1, nil, nil)
		plan.Full = true
		p := newProxier(t, a, o)
		p.coldBatch = 4
		if err := p.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
		if err := p.Apply(ctx, plan); err != nil {
			t.Fatalf("step %d: %v\n%s", step, err, plan)
		}
		st := p.LastStats()
		// The first transaction, at least one of service ports (the
		// plan has up to 8, some with several chains) and the base
		// chains': in each family.
		if !st.Rebuilt || st.Transactions < 4 {
			t.Fatalf("step %d: a cold start in parts of 4 messages sent %+v", step, st)
		}
		// The reference: a table that exists is replaced in one (as
		// after a failed restart; a restart rewrites it in parts).
		if _, err := b.Run("nft", "add table ip "+TableName+"; add table ip6 "+TableName); err != nil {
			t.Fatal(err)
		}
		q := newProxier(t, b, o)
		oneTransaction(q)
		if err := q.Apply(ctx, plan); err != nil {
			t.Fatal(err)
		}
		if st := q.LastStats(); st.Transactions != 1 {
			t.Fatalf("step %d: the rewrite of an existing table sent %d transactions, want 1", step, st.Transactions)
		}
		if got, want := tables(t, a), tables(t, b); got != want {
			t.Fatalf("step %d, plan\n%s\ncold start in parts:\n%s\nin one transaction:\n%s", step, plan, got, want)
		}
		// Nothing to send afterwards, and our own commits left the
		// tables as the next compare expects.
		if err := p.Apply(ctx, plan); err != nil {
			t.Fatal(err)
		}
		if st := p.LastStats(); st.Rebuilt || st.Messages != 0 {
			t.Fatalf("step %d: a compare after the cold start sent %+v", step, st)
		}
	}

	// A service port that cannot be written, sorted after the others:
	// the transactions before it are in, without a base chain.
	long := svcName("zz", strings.Repeat("n", 250), "")
	ep := datapath.Endpoint{Addr: netip.MustParseAddrPort("10.244.1.2:8080"), Weight: 1}
	good := newPlan(1,
		clusterIP(svcName("aa", "web", ""), datapath.TCP, "10.96.0.10", 80, ep),
		clusterIP(svcName("bb", "web", ""), datapath.TCP, "10.96.0.11", 80, ep))
	bad := newPlan(1, append(append([]datapath.Frontend(nil), good.Frontends...),
		clusterIP(long, datapath.TCP, "10.96.0.12", 80, ep))...)
	p := newProxier(t, a, o)
	p.coldBatch = 2
	if err := p.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Apply(ctx, bad); err == nil {
		t.Fatal("a chain name over 256 bytes was written")
	}
	half := listOurs(t, a, "ip")
	if !strings.Contains(half, "chain svc-aa/web") {
		t.Fatalf("the transactions before the failure are not in:\n%s", half)
	}
	if strings.Contains(half, "hook ") {
		t.Fatalf("a cold start that failed left a base chain:\n%s", half)
	}
	if err := p.Apply(ctx, good); err != nil {
		t.Fatal(err)
	}
	if st := p.LastStats(); !st.Rebuilt || st.Transactions < 3 {
		t.Fatalf("the apply after a failed cold start: %+v, want a cold start again", st)
	}
	if _, err := b.Run("nft", "add table ip "+TableName+"; add table ip6 "+TableName); err != nil {
		t.Fatal(err)
	}
	q := newProxier(t, b, o)
	oneTransaction(q)
	if err := q.Apply(ctx, good); err != nil {
		t.Fatal(err)
	}
	if got, want := tables(t, a), tables(t, b); got != want {
		t.Fatalf("after a failed cold start:\n%s\nin one transaction:\n%s", got, want)
	}
}

// oneTransaction makes p's first apply over a table the kernel holds
// replace it in one transaction, as after a failed restart.
func oneTransaction(p *Proxier) {
	for _, t := range p.tables {
		t.restartFailed = true
	}
}

// tables lists our tables, the ip one first (a table written again after
// the other is listed after it by nft list ruleset).
func tables(t *testing.T, ns *netns.NS) string {
	t.Helper()
	return canonical(listOurs(t, ns, "ip")) + canonical(listOurs(t, ns, "ip6"))
}

// A transaction the kernel refuses in the middle of a cold start stops
// it: the one queued behind it (see pipe) is never sent, and the next
// apply writes the table again.
func TestColdStartStopsAtFailure(t *testing.T) {
	kernel(t)
	ctx := context.Background()
	o := Options{ClusterCIDRs: []netip.Prefix{clusterCIDR}}
	a := netns.New(t, "nftcold")
	ep := datapath.Endpoint{Addr: netip.MustParseAddrPort("10.244.1.2:8080"), Weight: 1}
	var fs []datapath.Frontend
	for i, n := range []string{"aa", "bb", "cc", "dd"} {
		fs = append(fs, clusterIP(svcName(n, "web", ""), datapath.TCP, fmt.Sprintf("10.96.0.%d", 10+i), 80, ep))
	}
	plan := newPlan(1, fs...)
	p := newProxier(t, a, o)
	if err := p.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	// Batches of 2 messages: one service port a transaction, in order,
	// after the first (the table). Once aa's is in, an element of bb's
	// key with another verdict makes bb's transaction fail.
	p.coldBatch = 2
	sent := 0
	p.txDone = func() {
		if sent++; sent == 1 {
			if _, err := a.Run("nft", "add element ip "+shardTable(svcName("bb", "web", ""))+" service-ips { 10.96.0.11 . tcp . 80 : drop }"); err != nil {
				t.Error(err)
			}
		}
	}
	if err := p.Apply(ctx, plan); err == nil {
		t.Fatal("the cold start succeeded over a clashing element")
	}
	got := listOurs(t, a, "ip")
	if !strings.Contains(got, "chain svc-aa/web") {
		t.Fatalf("the transaction before the failure is not in:\n%s", got)
	}
	for _, c := range []string{"svc-bb/web", "svc-cc/web", "svc-dd/web"} {
		if strings.Contains(got, "chain "+c+" ") {
			t.Fatalf("%s was written after the failure:\n%s", c, got)
		}
	}
	p.txDone = nil
	if err := p.Apply(ctx, plan); err != nil {
		t.Fatal(err)
	}
	got = listOurs(t, a, "ip")
	for _, c := range []string{"svc-aa/web", "svc-bb/web", "svc-cc/web", "svc-dd/web", "hook prerouting"} {
		if !strings.Contains(got, c) {
			t.Fatalf("after the apply that followed the failure, %q is missing:\n%s", c, got)
		}
	}
}
