package bench

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/nftables"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
)

// nativePlan is a small plan of every kind of frontend the bench's native
// floor must copy: ClusterIPs with equal and unequal weights, a NodePort,
// a LoadBalancer with source ranges (an interval set), session affinity
// (a dynamic map) and a Service without endpoints.
func nativePlan() *datapath.Plan {
	ep := func(s string, w uint32) datapath.Endpoint {
		return datapath.Endpoint{Addr: netip.MustParseAddrPort(s), Weight: w}
	}
	svc := func(name string) datapath.ServicePortName {
		return datapath.ServicePortName{Namespace: "bench", Name: name, Port: "http"}
	}
	return &datapath.Plan{Generation: 1, Full: true, Frontends: []datapath.Frontend{
		{Service: svc("a"), Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: netip.MustParseAddr("10.96.0.1"), Family: datapath.IPv4, Port: 80,
			Endpoints: []datapath.Endpoint{ep("10.128.0.1:8080", 1), ep("10.128.0.2:8080", 1), ep("10.128.0.3:8080", 1)}},
		{Service: svc("b"), Kind: datapath.ClusterIP, Protocol: datapath.UDP, Addr: netip.MustParseAddr("10.96.0.2"), Family: datapath.IPv4, Port: 53,
			Endpoints: []datapath.Endpoint{ep("10.128.1.1:53", 3), ep("10.128.1.2:53", 1)}},
		{Service: svc("b"), Kind: datapath.NodePort, Protocol: datapath.UDP, Family: datapath.IPv4, Port: 30053,
			Endpoints: []datapath.Endpoint{ep("10.128.1.1:53", 3), ep("10.128.1.2:53", 1)}},
		{Service: svc("c"), Kind: datapath.LoadBalancer, Protocol: datapath.TCP, Addr: netip.MustParseAddr("192.0.2.10"), Family: datapath.IPv4, Port: 443,
			Endpoints: []datapath.Endpoint{ep("10.128.2.1:8443", 1)}, SourceRanges: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}},
		{Service: svc("d"), Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: netip.MustParseAddr("10.96.0.4"), Family: datapath.IPv4, Port: 80,
			Endpoints: []datapath.Endpoint{ep("10.128.3.1:80", 1), ep("10.128.3.2:80", 1)}, Affinity: 3 * time.Hour},
		{Service: svc("e"), Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: netip.MustParseAddr("10.96.0.5"), Family: datapath.IPv4, Port: 80},
	}}
}

// svcA is the Service chain of nativePlan's first Service.
const svcA = "svc-bench/a/http"

// The bench reads edgeproxy's nftables layout (dispatch map, a numgen
// map, dnat in the Service chain) from the kernel's events and dumps,
// counts what a one-Service change writes, and its native floor writes
// the same table again, object for object, in one batch.
func TestNativeLayoutAndFloor(t *testing.T) {
	gate.Root(t)
	gate.Binaries(t, "nft", "ip")
	ns, err := NewNetns("native")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	k, err := ns.OpenKernel("nft")
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	w, ctx := startWatcher(t, k)
	p, err := nftables.New(nftables.Options{MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		NetNS: int(ns.h), NoConntrack: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	plan := nativePlan()
	if err := p.Apply(context.Background(), plan); err != nil {
		t.Fatal(err)
	}
	want := map[Dest]struct{}{}
	for _, f := range plan.Frontends {
		for _, e := range f.Endpoints {
			want[DestOf(e.Addr)] = struct{}{}
		}
	}
	if _, n, err := w.WaitAll(ctx, want, 10*time.Second, func() error { return nil }); err != nil {
		t.Fatalf("the watcher sees %d of %d endpoints of the native layout: %v", n, len(want), err)
	}
	if got := scanAll(t, k); len(got) < len(want) {
		t.Fatalf("a dump finds %v, want every one of %d endpoints", got, len(want))
	}

	// One Service's endpoint replaced: the watcher sees it and counts
	// what the transaction wrote; the replaced one is gone.
	w0 := w.Written()
	moved := netip.MustParseAddrPort("10.128.0.9:8080")
	plan.Generation, plan.Full = 2, false
	plan.Changed = map[datapath.ServicePortName]bool{plan.Frontends[0].Service: true}
	plan.Frontends[0].Endpoints[1].Addr = moved
	if err := p.Apply(context.Background(), plan); err != nil {
		t.Fatal(err)
	}
	if _, err := w.WaitFlip(ctx, DestOf(moved), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if w.Has(DestOf(netip.MustParseAddrPort("10.128.0.2:8080"))) {
		t.Fatal("the replaced endpoint stays in the watcher's view")
	}
	if d := w.Written().Sub(w0); d.Transactions != 1 || d.Messages == 0 || d.Bytes < 16*d.Messages {
		t.Fatalf("one change wrote %+v, want one transaction of messages", d)
	}

	// The floor: the tables copied into an empty namespace are the same
	// tables, as nft prints them.
	var cps []*nftCopy
	err = ns.Do(func() error {
		c, err := dialNFT()
		if err != nil {
			return err
		}
		defer c.Close()
		cps, err = readNFTTables(c, nfprotoIPv4, nftables.TableName)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	err = ns.Do(func() error { // no such table in another family
		c, err := dialNFT()
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = readNFTTables(c, nfprotoIPv6, nftables.TableName)
		return err
	})
	if err == nil {
		t.Fatal("read an ip6 table that was never written")
	}
	if len(cps) != nftables.Shards+1 {
		t.Fatalf("read %d tables, want the main one and %d service tables", len(cps), nftables.Shards)
	}
	// svcA's table: the one holding its chain.
	var cp *nftCopy
	var all []rawMsg
	for _, c := range cps {
		if _, ok := c.rules[svcA]; ok {
			cp = c
		}
		all = append(all, c.msgs...)
	}
	if cp == nil {
		t.Fatalf("no table holds %s", svcA)
	}
	empty, err := NewNetns("native-floor")
	if err != nil {
		t.Fatal(err)
	}
	defer empty.Close()
	// A batch the kernel refuses (a chain in a table that is not there)
	// is an error, not a time.
	err = empty.Do(func() error {
		_, err := sendBatch(marshalBatch(cp.chainAs(svcA, "epb-floor-1")))
		return err
	})
	if err == nil {
		t.Fatal("a chain was added to a table that does not exist")
	}
	err = empty.Do(func() error {
		_, err := sendBatch(marshalBatch(all))
		return err
	})

	if err != nil {
		t.Fatal(err)
	}
	orig, err := ns.Run("nft", "list", "ruleset")
	if err != nil {
		t.Fatal(err)
	}
	copied, err := empty.Run("nft", "list", "ruleset")
	if err != nil {
		t.Fatal(err)
	}
	if orig != copied {
		t.Fatalf("the copy differs from the table:\n--- table\n%s\n--- copy\n%s", orig, copied)
	}
	for _, want := range []string{"map { 0 : 10.128.0.1 . 8080, 1 : 10.128.0.9 . 8080", "@service-ips", "198.51.100.0/24", "update @aff-"} {
		if !strings.Contains(copied, want) {
			t.Errorf("the copy lacks %q:\n%s", want, copied)
		}
	}

	// The one-change floor: a Service chain copied under a new name,
	// twice (its map is copied each time: an anonymous set binds to one
	// rule).
	for _, name := range []string{"epb-floor-1", "epb-floor-2"} {
		err = empty.Do(func() error {
			_, err := sendBatch(marshalBatch(cp.chainAs(svcA, name)))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		one, err := empty.Run("nft", "list", "chain", "ip", cp.table, name)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(one, "dnat ip to numgen random mod 3 map { 0 : 10.128.0.1 . 8080, 1 : 10.128.0.9 . 8080, 2 : 10.128.0.3 . 8080 }"); n != 1 {
			t.Fatalf("the copied chain has %d dnat rules of svcA's map, want 1:\n%s", n, one)
		}
	}
}
