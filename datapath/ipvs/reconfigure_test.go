package ipvs

import (
	"context"
	"maps"
	"net/netip"
	"slices"
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

// New sets what IPVS needs, conn_reuse_mode only on a kernel that needs
// the workaround, and the settings' own parameters.
func TestNewSysctls(t *testing.T) {
	base := []string{"net/ipv4/vs/conntrack", "net/ipv4/vs/expire_nodest_conn", "net/ipv4/vs/expire_quiescent_template", "net/ipv4/ip_forward"}
	for _, c := range []struct {
		name    string
		opts    Options
		release string
		want    []string
	}{
		{"fixed kernel", Options{}, "6.1.0-56-amd64", base},
		{"conn_reuse workaround", Options{}, "5.4.0-150-generic", append(slices.Clone(base), "net/ipv4/vs/conn_reuse_mode")},
		{"strict ARP and IPv6", Options{StrictARP: true, IPv6: true}, "6.1.0",
			append(slices.Clone(base), "net/ipv4/conf/all/arp_ignore", "net/ipv4/conf/all/arp_announce", "net/ipv6/conf/all/forwarding")},
		{"IPv6 keeping forwarding", Options{IPv6: true, KeepIPv6Forwarding: true}, "6.1.0", base},
	} {
		got := c.opts.newSysctls(c.release)
		if !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(slices.Values(c.want))) {
			t.Errorf("%s: %v, want the keys %v", c.name, got, c.want)
		}
		if v, ok := got["net/ipv4/vs/conn_reuse_mode"]; ok && v != "0" {
			t.Errorf("%s: conn_reuse_mode %q, want 0", c.name, v)
		}
	}
}
