package nftables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// benchPlan is n ClusterIP Services (TCP) × 10 endpoints, the shape of
// issue 27's measurements.
func benchPlan(n int) *datapath.Plan {
	p := &datapath.Plan{Generation: 1, Full: true}
	for i := range n {
		s := datapath.ServicePortName{Namespace: "bench", Name: fmt.Sprintf("svc-%05d", i)}
		vip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		var eps []datapath.Endpoint
		for j := range 10 {
			k := i*10 + j
			eps = append(eps, datapath.Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 128 + byte(k>>16), byte(k >> 8), byte(k)}), 8080), Weight: 1})
		}
		p.Frontends = append(p.Frontends, datapath.Frontend{Service: s, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: vip, Family: datapath.IPv4, Port: 80, Endpoints: eps})
	}
	p.Sort()
	return p
}

var benchSizes = []int{1000, 5000, 10000}

// BenchmarkColdStart: the whole plan into an empty namespace (the table
// is removed between iterations, untimed). peakRSS-MiB is the process's
// peak resident set during the Apply (VmHWM, reset before it), after a
// collection: what a cold start costs in memory on top of the plan;
// user-ms/op and sys-ms/op the process's CPU time in it (cpuTime).
func BenchmarkColdStart(b *testing.B) {
	gate.Root(b)
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			coldStarts(b, netns.New(b, "nftbench"), n)
		})
	}
}

// coldStarts times cold starts of n Services into ns, each into an empty
// table (removed untimed), and reports their cost.
func coldStarts(b *testing.B, ns *netns.NS, n int) {
	plan := benchPlan(n)
	ctx := context.Background()
	var cost applyCost
	for b.Loop() {
		b.StopTimer()
		p, err := New(Options{MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{clusterCIDR}, NetNS: int(ns.Handle()), NoConntrack: true})
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Cleanup(ctx); err != nil {
			b.Fatal(err)
		}
		p.tables[0] = newTable(famIPv4)
		cost.apply(ctx, b, p, plan)
		b.StartTimer()
	}
	cost.report(b)
}

// BenchmarkColdStartWatched is BenchmarkColdStart with a reader of the
// namespace's nf_tables events, as test/bench's epbench has in every
// proxy's run: the kernel then builds a notification of every object a
// commit adds, and the reader's work shares the cores.
func BenchmarkColdStartWatched(b *testing.B) {
	gate.Root(b)
	for _, n := range []int{5000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			ns := netns.New(b, "nftbench")
			readEvents(b, ns)
			coldStarts(b, ns, n)
		})
	}
}

// readEvents subscribes a socket in ns to nf_tables' event group and reads
// it until the benchmark ends.
func readEvents(b *testing.B, ns *netns.NS) {
	var c *netlink.Conn
	if err := ns.Do(func() error {
		var err error
		c, err = netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{Groups: 1 << (unix.NFNLGRP_NFTABLES - 1)})
		return err
	}); err != nil {
		b.Fatal(err)
	}
	// As epbench's: large enough that a cold start never overflows it.
	if rc, err := c.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 256<<20) })
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := c.Receive(); err != nil && !errors.Is(err, unix.ENOBUFS) {
				return
			}
		}
	}()
	b.Cleanup(func() {
		c.Close()
		<-done
	})
}

// BenchmarkRestart: the whole plan over the table an earlier Proxier
// wrote of it (untimed), by a new Proxier: an agent's restart. With
// oneTransaction the table is replaced in one transaction (what a
// restart did before warmStart, and what follows a failed one);
// otherwise it is rewritten in bounded transactions. peakRSS-MiB as in
// BenchmarkColdStart.
func BenchmarkRestart(b *testing.B) {
	gate.Root(b)
	for _, n := range benchSizes {
		for _, one := range []bool{false, true} {
			b.Run(fmt.Sprintf("services=%d/oneTransaction=%v", n, one), func(b *testing.B) {
				ns := netns.New(b, "nftbench")
				plan := benchPlan(n)
				ctx := context.Background()
				opts := Options{MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{clusterCIDR}, NetNS: int(ns.Handle()), NoConntrack: true}
				first, err := New(opts)
				if err != nil {
					b.Fatal(err)
				}
				if err := first.Apply(ctx, plan); err != nil {
					b.Fatal(err)
				}
				_ = first.Close()
				var cost applyCost
				for b.Loop() {
					b.StopTimer()
					p, err := New(opts)
					if err != nil {
						b.Fatal(err)
					}
					p.tables[0].restartFailed = one
					cost.apply(ctx, b, p, plan)
					b.StartTimer()
				}
				cost.report(b)
			})
		}
	}
}

// applyCost sums up the timed applies of a cold start or restart
// benchmark.
type applyCost struct {
	msgs, txs int
	peak      int64
	user, sys time.Duration
}

// apply times p.Apply(plan) (the timer is stopped when it is called and
// when it returns), its CPU time and peak resident set after a
// collection, then closes p.
func (c *applyCost) apply(ctx context.Context, b *testing.B, p *Proxier, plan *datapath.Plan) {
	runtime.GC()
	resetPeakRSS(b)
	u0, s0 := cpuTime(b)
	b.StartTimer()
	if err := p.Apply(ctx, plan); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	u1, s1 := cpuTime(b)
	c.user, c.sys = c.user+u1-u0, c.sys+s1-s0
	c.peak = max(c.peak, peakRSS(b))
	c.msgs, c.txs = p.LastStats().Messages, p.LastStats().Transactions
	_ = p.Close()
}

func (c *applyCost) report(b *testing.B) {
	b.ReportMetric(float64(c.msgs), "ops/sync")
	b.ReportMetric(float64(c.txs), "transactions/sync")
	b.ReportMetric(float64(c.peak)/(1<<20), "peakRSS-MiB")
	b.ReportMetric(float64(c.user.Microseconds())/1000/float64(b.N), "user-ms/op")
	b.ReportMetric(float64(c.sys.Microseconds())/1000/float64(b.N), "sys-ms/op")
}

// cpuTime is the CPU time the process has used, user and system: the
// kernel commits a transaction in the sending thread, so its work is in
// it too (sys). Under load it is steadier than the wall clock.
func cpuTime(b *testing.B) (user, sys time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

// resetPeakRSS resets the process's peak resident set (VmHWM).
func resetPeakRSS(b *testing.B) {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Fatal(err)
	}
}

// peakRSS is the process's peak resident set since the last reset.
func peakRSS(b *testing.B) int64 {
	s, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for l := range strings.Lines(string(s)) {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatal("no VmHWM in /proc/self/status")
	return 0
}

// BenchmarkUpdateOne: one Service's endpoints change (one of ten is
// replaced) in a table holding n Services: a partial sync. heldB/service
// is the heap the Proxier keeps per Service between syncs; p50-ms and
// p99-ms are the Apply's latencies.
func BenchmarkUpdateOne(b *testing.B) {
	gate.Root(b)
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			ns := netns.New(b, "nftbench")
			plan := benchPlan(n)
			before := heap()
			p, err := New(Options{MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{clusterCIDR}, NetNS: int(ns.Handle()), NoConntrack: true})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			ctx := context.Background()
			if err := p.Apply(ctx, plan); err != nil {
				b.Fatal(err)
			}
			held := heap() - before
			i := n / 2
			f := &plan.Frontends[i]
			orig := f.Endpoints
			moved := append([]datapath.Endpoint(nil), orig...)
			moved[3].Addr = netip.AddrPortFrom(netip.MustParseAddr("10.200.0.1"), 8080)
			plan.Full, plan.Changed = false, map[datapath.ServicePortName]bool{f.Service: true}
			k := 0
			var took []time.Duration
			for b.Loop() {
				if k%2 == 0 {
					f.Endpoints = moved
				} else {
					f.Endpoints = orig
				}
				k++
				start := time.Now()
				if err := p.Apply(ctx, plan); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(start))
			}
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
			st := p.LastStats()
			if st.Rebuilt || st.Units != 1 {
				b.Fatalf("not a partial sync: %+v", st)
			}
			b.ReportMetric(float64(st.Messages), "ops/sync")
			b.ReportMetric(float64(held)/float64(n), "heldB/service")
			runtime.KeepAlive(p)
		})
	}
}

// heap is the live heap after a collection.
func heap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// BenchmarkProbe: the kernel probe every start of nftables mode sends
// (both families; the throwaway table is never committed).
func BenchmarkProbe(b *testing.B) {
	gate.Root(b)
	ns := netns.New(b, "nftbench")
	p, err := New(Options{MasqueradeBit: 14, IPv6: true, NetNS: int(ns.Handle()), NoConntrack: true, NoSysctls: true})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	for b.Loop() {
		if err := p.Probe(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUpdateParts splits what one change costs the kernel, in a table
// of n Services written by the Proxier: each sub-benchmark times one kind
// of transaction sent on the Proxier's connection (what the iteration
// changed is undone untimed), p50-ms and p99-ms over the iterations.
//
//   - floor: a new chain with ten dnat rules (the bench's native floor);
//   - flush-add: the Service chain flushed and its ten rules written again
//     (the rules of today's change without its elements);
//   - del-elem: one hairpin element deleted;
//   - add-elem: one hairpin element added;
//   - swap: one dispatch element deleted and added again with another chain;
//   - new-swap: a new chain with ten rules and the swap in one transaction;
//   - del-chain: an unreferenced chain with ten rules deleted;
//   - del-vmap-elem: one dispatch element deleted;
//   - flush: the Service chain's ten rules deleted;
//   - getgen: one ruleset generation request (a round trip).
func BenchmarkUpdateParts(b *testing.B) {
	gate.Root(b)
	for _, n := range []int{5000, 10000} {
		for _, k := range []int{1, Shards} {
			b.Run(fmt.Sprintf("services=%d/shards=%d", n, k), func(b *testing.B) { updateParts(b, n, k) })
		}
	}
}

// updateParts is BenchmarkUpdateParts at n Services spread over k service
// tables: each part in the table of the Service it changes.
func updateParts(b *testing.B, n, k int) {
	ns := netns.New(b, "nftbench")
	plan := benchPlan(n)
	p, err := New(Options{MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{clusterCIDR}, NetNS: int(ns.Handle()), NoConntrack: true, shards: k})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	if err := p.Apply(ctx, plan); err != nil {
		b.Fatal(err)
	}
	f := famIPv4
	fr := &plan.Frontends[n/2]
	u, err := buildUnit(f, &p.opts, []datapath.Frontend{*fr})
	if err != nil {
		b.Fatal(err)
	}
	svc := u.chains[0]
	ob := newObjects(f, k)
	tb := ob.tabs[u.tab] // the Service's table
	svcSets, mainSets := ob.sets[u.tab], ob.sets[0]
	c := p.conn
	send := func(b *testing.B) {
		if err := c.Flush(); err != nil {
			b.Fatal(err)
		}
	}
	addChain := func(name string) {
		ch := &nftables.Chain{Name: name, Table: tb}
		c.AddChain(ch)
		for _, r := range svc.rules {
			c.AddRule(&nftables.Rule{Table: tb, Chain: ch, Exprs: r.exprs})
		}
	}
	hp := elemKey{set: setHairpin, key: keyHairpin(netip.MustParseAddr("10.201.0.1"))}
	dispatch := func(del bool, chain string) {
		k := elemKey{set: mapServiceIPs, key: keyAddrProtoPort(fr.Addr, fr.Protocol, fr.Port)}
		e := []nftables.SetElement{{Key: []byte(k.key), VerdictData: verdict(expr.VerdictGoto, chain)}}
		if del {
			_ = c.SetDeleteElements(svcSets[mapServiceIPs], e)
		} else {
			_ = c.SetAddElements(svcSets[mapServiceIPs], e)
		}
	}
	hairpin := func(del bool) {
		e := []nftables.SetElement{{Key: []byte(hp.key)}}
		if del {
			_ = c.SetDeleteElements(mainSets[setHairpin], e)
		} else {
			_ = c.SetAddElements(mainSets[setHairpin], e)
		}
	}
	part := func(name string, setup, timed, undo func()) {
		b.Run(name, func(b *testing.B) {
			var took []time.Duration
			for b.Loop() {
				b.StopTimer()
				if setup != nil {
					setup()
					send(b)
				}
				b.StartTimer()
				start := time.Now()
				timed()
				send(b)
				took = append(took, time.Since(start))
				b.StopTimer()
				if undo != nil {
					undo()
					send(b)
				}
				b.StartTimer()
			}
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
	delChain := func(name string) func() {
		return func() { c.DelChain(&nftables.Chain{Name: name, Table: tb}) }
	}
	part("floor", nil, func() { addChain("floor") }, delChain("floor"))
	part("flush-add", nil, func() {
		c.FlushChain(&nftables.Chain{Name: svc.name, Table: tb})
		for _, r := range svc.rules {
			c.AddRule(&nftables.Rule{Table: tb, Chain: &nftables.Chain{Name: svc.name, Table: tb}, Exprs: r.exprs})
		}
	}, nil)
	part("del-elem", func() { hairpin(false) }, func() { hairpin(true) }, nil)
	part("add-elem", nil, func() { hairpin(false) }, func() { hairpin(true) })
	part("swap", func() { addChain("other") }, func() { dispatch(true, svc.name); dispatch(false, "other") },
		func() { dispatch(true, "other"); dispatch(false, svc.name); delChain("other")() })
	part("new-swap", nil, func() { addChain("other"); dispatch(true, svc.name); dispatch(false, "other") },
		func() { dispatch(true, "other"); dispatch(false, svc.name); delChain("other")() })
	part("del-chain", func() { addChain("gone") }, delChain("gone"), nil)
	spare := func(del bool) {
		k := keyAddrProtoPort(netip.MustParseAddr("10.97.0.1"), datapath.TCP, 80)
		e := []nftables.SetElement{{Key: []byte(k), VerdictData: verdict(expr.VerdictGoto, svc.name)}}
		if del {
			_ = c.SetDeleteElements(svcSets[mapServiceIPs], e)
		} else {
			_ = c.SetAddElements(svcSets[mapServiceIPs], e)
		}
	}
	part("del-vmap-elem", func() { spare(false) }, func() { spare(true) }, nil)
	part("flush", nil, func() { c.FlushChain(&nftables.Chain{Name: svc.name, Table: tb}) }, func() {
		for _, r := range svc.rules {
			c.AddRule(&nftables.Rule{Table: tb, Chain: &nftables.Chain{Name: svc.name, Table: tb}, Exprs: r.exprs})
		}
	})
	b.Run("getgen", func(b *testing.B) {
		var took []time.Duration
		for b.Loop() {
			start := time.Now()
			if _, err := c.GetGen(); err != nil {
				b.Fatal(err)
			}
			took = append(took, time.Since(start))
		}
		slices.Sort(took)
		b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
	})
}

// BenchmarkCompare: the sync.period compare of a table holding n
// Services when nothing changed (plan.Full with the plan last applied):
// what it costs the agent, since it sends nothing.
func BenchmarkCompare(b *testing.B) {
	gate.Root(b)
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			ns := netns.New(b, "nftbench")
			plan := benchPlan(n)
			p, err := New(Options{MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{clusterCIDR}, NetNS: int(ns.Handle()), NoConntrack: true})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			ctx := context.Background()
			if err := p.Apply(ctx, plan); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if err := p.Apply(ctx, plan); err != nil {
					b.Fatal(err)
				}
			}
			if st := p.LastStats(); st.Rebuilt || st.Messages != 0 {
				b.Fatalf("the compare wrote: %+v", st)
			}
		})
	}
}
