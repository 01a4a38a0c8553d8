package nftables

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// A restart (a new Proxier over a table an earlier one wrote) rewrites
// the table in bounded transactions, whether the plan is the same or
// has changed (Services removed, added and changed), and leaves the
// table a cold start of the plan writes. After every transaction each
// frontend of a Service in both plans is still in a dispatch map and the
// base chains are there: no Service goes missing while it runs.
func TestRestartInParts(t *testing.T) {
	kernel(t)
	ctx := context.Background()
	o := Options{ClusterCIDRs: []netip.Prefix{clusterCIDR, clusterCIDR6}, IPv6: true}
	r := rand.New(rand.NewPCG(27, 6))
	a, b := netns.New(t, "nftwarm"), netns.New(t, "nftwarmref")
	sawChanged, sawStale := false, false
	for step := range 12 {
		before := randomPlan(r, 1, nil, nil)
		before.Full = true
		after := before
		if step%3 != 0 {
			after = randomPlan(r, 2, nil, nil)
			after.Full = true
			sawChanged = true
		}
		p := newProxier(t, a, o)
		if err := p.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
		if err := p.Apply(ctx, before); err != nil {
			t.Fatalf("step %d: %v\n%s", step, err, before)
		}
		old := tables(t, a)
		_ = p.Close()

		// Cluster IPs in both plans, as nft lists their keys.
		key := func(f datapath.Frontend) string {
			return fmt.Sprintf("%s . %s . %d", f.Addr, strings.ToLower(string(f.Protocol)), f.Port)
		}
		inBefore := map[string]bool{}
		for _, f := range before.Frontends {
			if f.Kind == datapath.ClusterIP {
				inBefore[key(f)] = true
			}
		}
		var keep []string
		for _, f := range after.Frontends {
			if f.Kind == datapath.ClusterIP && inBefore[key(f)] {
				keep = append(keep, key(f))
			}
		}
		q := newProxier(t, a, o)
		q.restartBatch = 3
		txs := 0
		q.txDone = func() {
			txs++
			now := tables(t, a)
			if strings.Count(now, " hook ") != strings.Count(old, " hook ") {
				t.Fatalf("step %d, after transaction %d: a base chain is missing:\n%s", step, txs, now)
			}
			for _, k := range keep {
				if !strings.Contains(now, k) {
					t.Fatalf("step %d, after transaction %d: %s is in no map:\n%s\nplan:\n%s", step, txs, k, now, after)
				}
			}
		}
		if err := q.Apply(ctx, after); err != nil {
			t.Fatalf("step %d: restart: %v\n%s", step, err, after)
		}
		st := q.LastStats()
		if !st.Rebuilt || st.Transactions < 4 || st.Transactions != txs+1 {
			t.Fatalf("step %d: a restart in parts of 3 messages sent %+v (%d seen)", step, st, txs)
		}
		// The reference: a cold start of the plan.
		ref := newProxier(t, b, o)
		if err := ref.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
		if err := ref.Apply(ctx, after); err != nil {
			t.Fatal(err)
		}
		got, want := tables(t, a), tables(t, b)
		if got != want {
			t.Fatalf("step %d, plan\n%s\nrestart over\n%s\nin parts:\n%s\ncold start:\n%s", step, after, old, got, want)
		}
		sawStale = sawStale || strings.Contains(old, "set aff-") && !strings.Contains(want, "set aff-") ||
			strings.Count(old, "chain ") > strings.Count(want, "chain ")
		// What the restart left in memory is the kernel's table.
		if err := q.Apply(ctx, after); err != nil {
			t.Fatal(err)
		}
		if st := q.LastStats(); st.Rebuilt || st.Messages != 0 {
			t.Fatalf("step %d: a compare after the restart sent %+v", step, st)
		}
	}
	if !sawChanged || !sawStale {
		t.Fatalf("the sequence never restarted onto a table with stale chains or sets (changed %v, stale %v)", sawChanged, sawStale)
	}
}

// A restart that fails half-way leaves a table that serves every
// Service; the next apply replaces it in one transaction.
func TestRestartFailure(t *testing.T) {
	kernel(t)
	ctx := context.Background()
	o := Options{ClusterCIDRs: []netip.Prefix{clusterCIDR, clusterCIDR6}, IPv6: true}
	a, b := netns.New(t, "nftwarm"), netns.New(t, "nftwarmref")
	ep := datapath.Endpoint{Addr: netip.MustParseAddrPort("10.244.1.2:8080"), Weight: 1}
	ep2 := datapath.Endpoint{Addr: netip.MustParseAddrPort("10.244.1.3:8080"), Weight: 1}
	good := newPlan(1,
		clusterIP(svcName("aa", "web", ""), datapath.TCP, "10.96.0.10", 80, ep),
		clusterIP(svcName("bb", "web", ""), datapath.TCP, "10.96.0.11", 80, ep))
	p := newProxier(t, a, o)
	if err := p.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Apply(ctx, good); err != nil {
		t.Fatal(err)
	}
	_ = p.Close()
	next := newPlan(2,
		clusterIP(svcName("aa", "web", ""), datapath.TCP, "10.96.0.10", 80, ep2),
		clusterIP(svcName("bb", "web", ""), datapath.TCP, "10.96.0.11", 80, ep2))
	bad := newPlan(2, append(append([]datapath.Frontend(nil), next.Frontends...),
		clusterIP(svcName("zz", strings.Repeat("n", 250), ""), datapath.TCP, "10.96.0.12", 80, ep))...)
	q := newProxier(t, a, o)
	q.restartBatch = 2
	if err := q.Apply(ctx, bad); err == nil {
		t.Fatal("a chain name over 256 bytes was written")
	}
	half := listOurs(t, a, "ip")
	for _, want := range []string{"type nat hook prerouting", "10.96.0.10 . tcp . 80 : goto svc-aa/web", "10.96.0.11 . tcp . 80 : goto svc-bb/web", "10.244.1.3:8080"} {
		if !strings.Contains(half, want) {
			t.Fatalf("after a failed restart, the table lacks %q:\n%s", want, half)
		}
	}
	if err := q.Apply(ctx, next); err != nil {
		t.Fatal(err)
	}
	if st := q.LastStats(); !st.Rebuilt || st.Transactions != 1 {
		t.Fatalf("the apply after a failed restart: %+v, want the table replaced in one transaction", st)
	}
	ref := newProxier(t, b, o)
	if err := ref.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ref.Apply(ctx, next); err != nil {
		t.Fatal(err)
	}
	if got, want := tables(t, a), tables(t, b); got != want {
		t.Fatalf("after a failed restart:\n%s\ncold start:\n%s", got, want)
	}
}

// A restart over the layout before the service tables (one table per
// family holding every Service's dispatch and chains, as
// testdata/one-table.golden, written by that version on goldenPlan)
// replaces it in one transaction with the tables a fresh start writes;
// and a rebuild deletes a table of ours the layout has not (a service
// table of another number).
func TestRestartFromOneTable(t *testing.T) {
	kernel(t)
	ctx := context.Background()
	o := Options{ClusterCIDRs: []netip.Prefix{clusterCIDR, netip.MustParsePrefix("fd00:244::/48")}, IPv6: true}
	a, fresh := netns.New(t, "nftupg"), netns.New(t, "nftupg2")
	if out, err := a.Run("nft", "-f", filepath.Join("testdata", "one-table.golden")); err != nil {
		t.Fatalf("nft -f one-table.golden: %v %s", err, out)
	}
	p := newProxier(t, a, o)
	if err := p.Apply(ctx, goldenPlan()); err != nil {
		t.Fatal(err)
	}
	if st := p.LastStats(); !st.Rebuilt || st.Transactions != 1 {
		t.Fatalf("the restart over one table: %+v, want it replaced in one transaction", st)
	}
	if err := newProxier(t, fresh, o).Apply(ctx, goldenPlan()); err != nil {
		t.Fatal(err)
	}
	want := tables(t, fresh)
	if got := tables(t, a); got != want {
		t.Fatalf("after the restart over one table:\n%s\nwant (a fresh start):\n%s", got, want)
	}

	if out, err := a.Run("nft", "add table ip "+ShardPrefix+"99; add chain ip "+ShardPrefix+"99 nat-output { type nat hook output priority -100; }"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	if err := p.Reconfigure(p.opts); err != nil { // the next apply rewrites the tables
		t.Fatal(err)
	}
	if err := p.Apply(ctx, goldenPlan()); err != nil {
		t.Fatal(err)
	}
	if st := p.LastStats(); !st.Rebuilt {
		t.Fatalf("after Reconfigure: %+v, want a rebuild", st)
	}
	if got := tables(t, a); got != want {
		t.Fatalf("after the rebuild:\n%s\nwant (a fresh start):\n%s", got, want)
	}
}
