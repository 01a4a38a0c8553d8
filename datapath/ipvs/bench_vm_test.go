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

// benchPlan has n ClusterIP services with 10 endpoints each; with dual,
// each service also has an IPv6 frontend with 10 IPv6 endpoints.
func benchPlan(n int, dual bool) *datapath.Plan {
	p := &datapath.Plan{Full: true}
	for i := range n {
		f := datapath.Frontend{
			Service: datapath.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("svc-%05d", i), Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP,
			Addr: netip.AddrFrom4([4]byte{10, 100, byte(i >> 8), byte(i)}), Family: datapath.IPv4, Port: 80,
		}
		f6 := f
		f6.Addr, f6.Family = netip.AddrFrom16([16]byte{0xfd, 0, 1, 0, 14: byte(i >> 8), 15: byte(i)}), datapath.IPv6
		for e := range 10 {
			f.Endpoints = append(f.Endpoints, datapath.Endpoint{
				Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)}), uint16(8000+e)), Weight: 1})
			f6.Endpoints = append(f6.Endpoints, datapath.Endpoint{
				Addr: netip.AddrPortFrom(netip.AddrFrom16([16]byte{0xfd, 0, 2, 0, 14: byte(i >> 8), 15: byte(i)}), uint16(8000+e)), Weight: 1})
		}
		p.Frontends = append(p.Frontends, f)
		if dual {
			p.Frontends = append(p.Frontends, f6)
		}
	}
	p.Sort()
	return p
}

// BenchmarkApply measures programming n services × 10 endpoints into an
// empty kernel (full) and the sync after one endpoint's weight changed
// (partial), with the netlink operations each made: IPv4 at 1k and 5k
// services, dual-stack (an IPv4 and an IPv6 frontend per service) at 1k.
// It runs in the VM (test/vm: EDGEPROXY_VM_BENCH=1 go -C test test ./vm
// -run GuestBenchmarks).
func BenchmarkApply(b *testing.B) {
	vm.Guest(b)
	gate.Root(b)
	node := netns.New(b, "bench")
	for _, c := range []struct {
		n    int
		dual bool
	}{{1000, false}, {1000, true}, {5000, false}} {
		stack := map[bool]string{false: "ipv4", true: "dual"}[c.dual]
		benchApply(b, node, fmt.Sprintf("%s/services=%d", stack, c.n), benchPlan(c.n, c.dual), c.dual)
	}
}

func benchApply(b *testing.B, node *netns.NS, name string, plan *datapath.Plan, ipv6 bool) {
	var p *Proxier
	do := func(fn func() error) {
		if err := node.Do(fn); err != nil {
			b.Fatal(err)
		}
	}
	do(func() error {
		var err error
		p, err = New(Options{NodeAddresses: []netip.Addr{}, IPv6: ipv6})
		return err
	})
	defer p.Close()
	b.Run(name+"/full", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			do(func() error { return p.Cleanup(context.Background()) })
			b.StartTimer()
			do(func() error { return p.Apply(context.Background(), plan) })
		}
		b.ReportMetric(float64(p.LastStats().Ops()), "netlink-ops/op")
	})
	b.Run(name+"/one-endpoint", func(b *testing.B) {
		partial := *plan
		partial.Full = false
		partial.Frontends = append([]datapath.Frontend(nil), plan.Frontends...)
		f := &partial.Frontends[len(partial.Frontends)/2]
		f.Endpoints = append([]datapath.Endpoint(nil), f.Endpoints...)
		partial.Changed = map[datapath.ServicePortName]bool{f.Service: true}
		for i := 0; b.Loop(); i++ {
			f.Endpoints[0].Weight = uint32(2 + i%2)
			do(func() error { return p.Apply(context.Background(), &partial) })
		}
		b.ReportMetric(float64(p.LastStats().Ops()), "netlink-ops/op")
	})
	do(func() error { return p.Cleanup(context.Background()) })
}
