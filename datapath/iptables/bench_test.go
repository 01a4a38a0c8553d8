package iptables_test

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/iptables"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// benchPlan has n service ports (ClusterIP, TCP), each with 10 endpoints;
// every tenth also has a NodePort. shift changes the endpoints of service 0.
func benchPlan(n, shift int) *datapath.Plan {
	p := &datapath.Plan{}
	for i := range n {
		svc := datapath.ServicePortName{Namespace: fmt.Sprintf("ns%d", i%50), Name: fmt.Sprintf("svc%d", i), Port: "http"}
		eps := make([]datapath.Endpoint, 10)
		for j := range eps {
			k := i*10 + j
			if i == 0 {
				k += shift * 10
			}
			eps[j] = datapath.Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(k >> 16), byte(k >> 8), byte(k)}), 8080), Weight: 1}
		}
		addr := netip.AddrFrom4([4]byte{172, 20, byte(i >> 8), byte(i)})
		p.Frontends = append(p.Frontends, datapath.Frontend{Service: svc, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: addr, Family: datapath.IPv4, Port: 80, Endpoints: eps})
		if i%10 == 0 {
			p.Frontends = append(p.Frontends, datapath.Frontend{Service: svc, Kind: datapath.NodePort, Protocol: datapath.TCP, Family: datapath.IPv4, Port: uint16(30000 + i%2000), Endpoints: eps})
		}
	}
	p.Sort()
	return p
}

var sizes = []int{1000, 5000, 10000}

func BenchmarkRender(b *testing.B) {
	cfg := iptables.Config{Family: datapath.IPv4, MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{clusterCIDR}}
	for _, n := range sizes {
		plan := benchPlan(n, 0)
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			var size int
			for b.Loop() {
				text, err := iptables.Render(cfg, plan.Frontends).RestoreText()
				if err != nil {
					b.Fatal(err)
				}
				size = len(text)
			}
			b.ReportMetric(float64(size), "restore-bytes")
		})
	}
}

// BenchmarkSync programs the plan into a node namespace with the real
// iptables-restore: "rewrite" rewrites every rule each time; "full" applies
// a plan with Full set (everything compared, fixed chains rewritten);
// "partial" changes one service's endpoints each time.
func BenchmarkSync(b *testing.B) {
	gate.Root(b)
	for _, v := range []iptables.Variant{iptables.Legacy, iptables.NFT} {
		for _, n := range sizes {
			b.Run(fmt.Sprintf("%s/services=%d", v, n), func(b *testing.B) {
				gate.Binaries(b, "iptables-"+string(v), "iptables-"+string(v)+"-restore")
				node := netns.New(b, "bench")
				var p *iptables.Proxier
				reg := prometheus.NewRegistry()
				if err := node.Do(func() (err error) {
					p, err = iptables.New(iptables.Options{Variant: v, MasqueradeBit: 14, NoConntrack: true, ClusterCIDRs: []netip.Prefix{clusterCIDR}, Registerer: reg})
					return err
				}); err != nil {
					b.Fatal(err)
				}
				apply := func(plan *datapath.Plan) {
					if err := node.Do(func() error { return p.Apply(context.Background(), plan) }); err != nil {
						b.Fatal(err)
					}
				}
				plans := [2]*datapath.Plan{benchPlan(n, 0), benchPlan(n, 1)}
				apply(plans[0])
				b.Run("rewrite", func(b *testing.B) {
					// A Proxier whose every apply rewrites everything, as on
					// start, after a failure or tampering, and once per
					// FullSyncPeriod.
					var rp *iptables.Proxier
					if err := node.Do(func() (err error) {
						rp, err = iptables.New(iptables.Options{Variant: v, MasqueradeBit: 14, NoConntrack: true, ClusterCIDRs: []netip.Prefix{clusterCIDR}, FullSyncPeriod: time.Nanosecond})
						return err
					}); err != nil {
						b.Fatal(err)
					}
					for b.Loop() {
						if err := node.Do(func() error { return rp.Apply(context.Background(), plans[0]) }); err != nil {
							b.Fatal(err)
						}
					}
				})
				b.Run("full", func(b *testing.B) {
					plans[0].Full = true
					for b.Loop() {
						apply(plans[0])
					}
					plans[0].Full = false
					reportBytes(b, reg)
				})
				b.Run("partial", func(b *testing.B) {
					i := 0
					for b.Loop() {
						i++
						plans[i%2].Changed = map[datapath.ServicePortName]bool{{Namespace: "ns0", Name: "svc0", Port: "http"}: true}
						apply(plans[i%2])
					}
					reportBytes(b, reg)
				})
			})
		}
	}
}

// reportBytes reports the size of the last iptables-restore input.
func reportBytes(b *testing.B, reg *prometheus.Registry) {
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == iptables.MetricRestoreBytes {
			b.ReportMetric(mf.GetMetric()[0].GetGauge().GetValue(), "restore-bytes")
		}
	}
}

// BenchmarkRetained measures what a Proxier keeps between syncs: the heap
// in use after applying a 5,000-service plan and a GC, minus the same with
// only the plan held. Run it with -benchtime=1x.
func BenchmarkRetained(b *testing.B) {
	gate.Root(b)
	gate.Binaries(b, "iptables-nft", "iptables-nft-restore")
	node := netns.New(b, "retained")
	plan := benchPlan(5000, 0)
	heap := func() uint64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse
	}
	for b.Loop() {
		base := heap()
		var p *iptables.Proxier
		if err := node.Do(func() (err error) {
			p, err = iptables.New(iptables.Options{Variant: iptables.NFT, MasqueradeBit: 14, NoConntrack: true, ClusterCIDRs: []netip.Prefix{clusterCIDR}})
			if err != nil {
				return err
			}
			return p.Apply(context.Background(), plan)
		}); err != nil {
			b.Fatal(err)
		}
		after := heap()
		runtime.KeepAlive(p)
		runtime.KeepAlive(plan)
		b.ReportMetric(float64(after-base)/(1<<20), "retained-MiB")
		if err := node.Do(func() error { return p.Cleanup(context.Background()) }); err != nil {
			b.Fatal(err)
		}
	}
}
