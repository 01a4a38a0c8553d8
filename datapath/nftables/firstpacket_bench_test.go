package nftables

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// BenchmarkFirstPacket: what the service tables cost a connection's first
// packet. In a namespace holding n Services over k service tables (k = 0:
// none of our tables, and no conntrack), the node sends UDP datagrams,
// each to a new destination port (a new conntrack entry: a socket of its
// own per batch of 1,000, so a new source port too), of an address that
// is no Service's (a veth's network, its neighbour static): each one goes through
// the nat output hooks of every service table, one dispatch lookup and
// one node-port rule (fib) each, the worst case (a Service's packet
// stops at its table's DNAT). ns-per-packet is the median of sendto's
// time per datagram over the batches (the output path runs in sendto),
// min-ns-per-packet the fastest batch's (less moved by other work on
// the machine); the difference between k values is the tables' cost.
func BenchmarkFirstPacket(b *testing.B) {
	gate.Root(b)
	const n = 5000
	for _, k := range []int{0, 1, Shards} {
		b.Run(fmt.Sprintf("services=%d/shards=%d", n, k), func(b *testing.B) {
			ns := netns.New(b, "nftfirst")
			for _, c := range [][]string{
				{"ip", "link", "set", "lo", "up"},
				{"ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1"},
				{"ip", "link", "set", "v0", "up"},
				{"ip", "link", "set", "v1", "up"},
				{"ip", "addr", "add", "198.51.100.1/24", "dev", "v0"},
				{"ip", "neigh", "add", "198.51.100.2", "lladdr", "02:00:00:00:00:02", "dev", "v0"},
			} {
				if out, err := ns.Run(c[0], c[1:]...); err != nil {
					b.Fatalf("%v: %v %s", c, err, out)
				}
			}
			if k > 0 {
				p, err := New(Options{MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{clusterCIDR}, NetNS: int(ns.Handle()), NoConntrack: true, NoSysctls: true, shards: k})
				if err != nil {
					b.Fatal(err)
				}
				defer p.Close()
				if err := p.Apply(context.Background(), benchPlan(n)); err != nil {
					b.Fatal(err)
				}
			}
			dst := netip.MustParseAddr("198.51.100.2")
			var per []float64
			port := 0
			for b.Loop() {
				err := ns.Do(func() error {
					c, err := net.ListenUDP("udp4", nil)
					if err != nil {
						return err
					}
					defer c.Close()
					msg := []byte("x")
					start := time.Now()
					for range 1000 {
						port = port%60000 + 1
						if _, err := c.WriteToUDPAddrPort(msg, netip.AddrPortFrom(dst, uint16(port))); err != nil {
							return err
						}
					}
					per = append(per, float64(time.Since(start).Nanoseconds())/1000)
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			slices.Sort(per)
			b.ReportMetric(per[len(per)/2], "ns-per-packet")
			b.ReportMetric(per[0], "min-ns-per-packet") // the least disturbed batch
		})
	}
}
