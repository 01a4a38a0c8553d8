package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/internal/testkit/vm"
)

// benchPlan has n ClusterIP services with 10 endpoints each.
func benchPlan(n int) *datapath.Plan {
	p := &datapath.Plan{Full: true}
	for i := range n {
		f := datapath.Frontend{
			Service: fmt.Sprintf("ns/svc-%05d:http", i), Kind: datapath.ClusterIP, Protocol: datapath.TCP,
			Addr: netip.AddrFrom4([4]byte{10, 100, byte(i >> 8), byte(i)}), Family: datapath.IPv4, Port: 80,
		}
		for e := range 10 {
			f.Endpoints = append(f.Endpoints, datapath.Endpoint{
				Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)}), uint16(8000+e)), Weight: 1})
		}
		p.Frontends = append(p.Frontends, f)
	}
	p.Sort()
	return p
}

// BenchmarkApply measures programming n services × 10 endpoints into an
// empty kernel (full) and the sync after one endpoint's weight changed
// (partial), with the netlink operations each made. It runs in the VM
// (test/vm: EDGEPROXY_VM_BENCH=1 go -C test test ./vm -run GuestBenchmarks).
func BenchmarkApply(b *testing.B) {
	vm.Guest(b)
	gate.Root(b)
	node := netns.New(b, "bench")
	for _, n := range []int{1000, 5000} {
		plan := benchPlan(n)
		var p *Proxier
		if err := node.Do(func() error {
			var err error
			p, err = New(Options{NodeAddresses: []netip.Addr{}})
			return err
		}); err != nil {
			b.Fatal(err)
		}
		do := func(fn func() error) {
			if err := node.Do(fn); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(fmt.Sprintf("services=%d/full", n), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				do(func() error { return p.Cleanup(context.Background()) })
				b.StartTimer()
				do(func() error { return p.Apply(context.Background(), plan) })
			}
			b.ReportMetric(float64(p.LastStats().Ops()), "netlink-ops/op")
		})
		b.Run(fmt.Sprintf("services=%d/one-endpoint", n), func(b *testing.B) {
			partial := *plan
			partial.Full = false
			partial.Frontends = append([]datapath.Frontend(nil), plan.Frontends...)
			f := &partial.Frontends[n/2]
			f.Endpoints = append([]datapath.Endpoint(nil), f.Endpoints...)
			partial.Changed = map[string]bool{f.Service: true}
			for i := 0; b.Loop(); i++ {
				f.Endpoints[0].Weight = uint32(2 + i%2)
				do(func() error { return p.Apply(context.Background(), &partial) })
			}
			b.ReportMetric(float64(p.LastStats().Ops()), "netlink-ops/op")
		})
		do(func() error { return p.Cleanup(context.Background()) })
		p.Close()
	}
}
