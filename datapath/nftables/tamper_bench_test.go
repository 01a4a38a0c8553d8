package nftables

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// BenchmarkTamperCheck: what the tamper check costs with a table of n
// Services × 10 endpoints. events: a look while the watch reads the
// events (after someone else's commit to another table, read whole);
// names: the look without events, which lists the chain names after any
// commit; rewrite: the full apply that follows a look that found the
// tables tampered with, or events lost over someone else's commit.
func BenchmarkTamperCheck(b *testing.B) {
	gate.Root(b)
	gate.Binaries(b, "nft")
	for _, n := range benchSizes {
		ns := netns.New(b, "nfttamperbench")
		p, err := New(Options{MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{clusterCIDR}, NetNS: int(ns.Handle()), NoConntrack: true})
		if err != nil {
			b.Fatal(err)
		}
		plan := benchPlan(n)
		ctx := context.Background()
		if err := p.Apply(ctx, plan); err != nil {
			b.Fatal(err)
		}
		other := func(b *testing.B, i int) {
			if _, err := ns.Run("nft", "add", "table", "ip", fmt.Sprintf("other%d", i)); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(fmt.Sprintf("services=%d/events", n), func(b *testing.B) {
			stop := watching(b, p)
			defer stop()
			i := 0
			for b.Loop() {
				b.StopTimer()
				other(b, i)
				i++
				settle(b, p)
				b.StartTimer()
				if bad, err := p.Tampered(ctx); err != nil || bad {
					b.Fatalf("Tampered = %v, %v", bad, err)
				}
			}
		})
		b.Run(fmt.Sprintf("services=%d/names", n), func(b *testing.B) {
			i := 0
			for b.Loop() {
				b.StopTimer()
				other(b, 1000+i)
				i++
				b.StartTimer()
				if bad, err := p.Tampered(ctx); err != nil || bad {
					b.Fatalf("Tampered = %v, %v", bad, err)
				}
			}
		})
		b.Run(fmt.Sprintf("services=%d/rewrite", n), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				p.markTampered()
				full := *plan
				full.Full, full.Changed = true, map[datapath.ServicePortName]bool{}
				b.StartTimer()
				if err := p.Apply(ctx, &full); err != nil {
					b.Fatal(err)
				}
				if !p.LastStats().Rebuilt {
					b.Fatal("no rewrite")
				}
			}
			b.ReportMetric(float64(p.LastStats().Bytes)/(1<<20), "MiB/rewrite")
		})
		_ = p.Close()
	}
}
