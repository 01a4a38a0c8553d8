package ipvs

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// TestReconfigure: settings changed while the proxier runs (a config
// reload) make the next Apply full, and that one programs them: the
// scheduler of the virtual servers in place, the static rules' mark and
// masquerading (traced), the connection timeouts at once. A bad value
// changes nothing.
func TestReconfigure(t *testing.T) {
	k := newFakeKernel()
	p, err := New(Options{Kernel: k, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}})
	if err != nil {
		t.Fatal(err)
	}
	vip := netip.MustParseAddr("10.96.0.10")
	key := Key{vip, datapath.TCP, 80}
	plan := &datapath.Plan{Full: true, Frontends: []datapath.Frontend{{Service: datapath.ServicePortName{Namespace: "ns", Name: "s"},
		Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: vip, Family: datapath.IPv4, Port: 80,
		Endpoints: []datapath.Endpoint{{Addr: netip.MustParseAddrPort("10.244.0.2:8080"), Weight: 1}}}}}
	// What Apply does with the servers and the IPv4 rules, but the link
	// and the sets (netlink).
	apply := func() {
		t.Helper()
		d, err := compute(p.cfg(nil), plan)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.fullSyncServers(d, map[netip.Addr]bool{}, nil, &Stats{}); err != nil {
			t.Fatal(err)
		}
		p.synced = true
	}
	// podToVIP traces a pod's packet to the ClusterIP through the static
	// rules: whether it is masqueraded, and the rules' text.
	podToVIP := func() (masq bool, text string) {
		t.Helper()
		text, err := p.ruleText(iptables{fam: datapath.IPv4})
		if err != nil {
			t.Fatal(err)
		}
		f := xtables.NewFake()
		if err := (iptables{x: f, fam: datapath.IPv4}).ensure(context.Background(), inSets(text, setName(setClusterIP, datapath.IPv4)+" dst,dst")); err != nil {
			t.Fatal(err)
		}
		paths, err := f.Trace(xtables.Packet{Src: netip.MustParseAddr("10.244.0.9"), Dst: vip, Proto: "tcp", Port: 80, InIface: "veth1"}, []netip.Addr{netip.MustParseAddr("192.168.1.10")})
		if err != nil || len(paths) != 1 {
			t.Fatalf("trace: %v, %v", paths, err)
		}
		return paths[0].Masquerade, text
	}
	apply()
	if masq, _ := podToVIP(); k.vs[key].Scheduler != "rr" || masq {
		t.Fatalf("before: scheduler %q, pod masqueraded %v; want rr, false", k.vs[key].Scheduler, masq)
	}

	if err := p.Reconfigure(Options{Scheduler: "lc", MasqueradeAll: true, MasqueradeBit: 12, TCPTimeout: 900 * time.Second,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}); err != nil {
		t.Fatal(err)
	}
	if p.synced {
		t.Fatal("the next Apply after Reconfigure is not full")
	}
	if k.tcp != 900*time.Second {
		t.Errorf("tcp timeout %v, want 900s", k.tcp)
	}
	apply()
	masq, text := podToVIP()
	if k.vs[key].Scheduler != "lc" || !masq || !strings.Contains(text, "0x1000/0x1000") || strings.Contains(text, "0x4000") {
		t.Fatalf("after: scheduler %q, pod masqueraded %v; want lc, true (masqueradeAll), mark 0x1000 only:\n%s", k.vs[key].Scheduler, masq, text)
	}

	before := p.opts
	if err := p.Reconfigure(Options{Scheduler: "rr", SchedulerFlags: []string{"no-such-flag"}}); err == nil {
		t.Fatal("an unknown scheduler flag accepted")
	}
	if err := p.Reconfigure(Options{MasqueradeBit: 40}); err == nil {
		t.Fatal("masquerade bit 40 accepted")
	}
	if !p.synced || p.opts.Scheduler != before.Scheduler || p.opts.MasqueradeBit != before.MasqueradeBit {
		t.Errorf("a refused Reconfigure changed the settings: %+v", p.opts)
	}
}
