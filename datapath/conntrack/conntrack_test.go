package conntrack_test

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	ct "github.com/ti-mo/conntrack"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/conntrack"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

type entry struct {
	proto         uint8
	client, orig  string // client and original destination
	reply         string // source of the reply tuple (the DNAT target)
	wantRemaining bool
}

// flow builds a conntrack entry for client -> orig answered by reply.
func flow(e entry) ct.Flow {
	c, o, r := netip.MustParseAddrPort(e.client), netip.MustParseAddrPort(e.orig), netip.MustParseAddrPort(e.reply)
	f := ct.NewFlow(e.proto, ct.StatusConfirmed, c.Addr(), o.Addr(), c.Port(), o.Port(), 120, 0)
	f.TupleReply.IP.SourceAddress = r.Addr()
	f.TupleReply.Proto.SourcePort = r.Port()
	return f
}

func key(f ct.Flow) string {
	return netip.AddrPortFrom(f.TupleOrig.IP.SourceAddress, f.TupleOrig.Proto.SourcePort).String() + ">" +
		netip.AddrPortFrom(f.TupleOrig.IP.DestinationAddress, f.TupleOrig.Proto.DestinationPort).String()
}

// TestReconcile programs conntrack entries in a fresh namespace and checks
// that exactly the stale UDP service entries go.
func TestReconcile(t *testing.T) {
	gate.Root(t)
	ns := netns.New(t, "ct")
	const udp, tcp = 17, 6
	nodeIP := netip.MustParseAddr("192.168.77.1")
	entries := []entry{
		{udp, "10.244.0.9:4000", "10.96.0.10:53", "10.244.0.2:53", true},         // current endpoint
		{udp, "10.244.0.9:4001", "10.96.0.10:53", "10.244.0.3:53", false},        // endpoint gone
		{udp, "10.244.0.9:4002", "10.96.0.10:53", "10.96.0.10:53", false},        // no DNAT: stuck before the service had endpoints
		{tcp, "10.244.0.9:4003", "10.96.0.10:53", "10.244.0.3:53", true},         // TCP is left alone
		{udp, "10.244.0.9:4004", "10.96.0.99:53", "10.96.0.99:53", true},         // not a service
		{udp, "10.244.0.9:4005", "10.96.0.11:53", "10.244.0.2:53", true},         // service without endpoints: left alone (kube-proxy)
		{udp, "10.244.0.9:4009", "10.96.0.10:53", "10.244.0.4:53", true},         // serving, not planned (terminating, or Local policy)
		{udp, "10.244.0.9:4011", "10.96.0.12:53", "10.244.0.3:53", true},         // service no longer planned: left alone
		{udp, "192.168.77.2:4006", "192.168.77.1:30053", "10.244.0.3:53", false}, // NodePort, endpoint gone
		{udp, "192.168.77.2:4007", "192.168.77.1:30053", "10.244.0.2:53", true},  // NodePort, current endpoint
		{udp, "192.168.77.2:4008", "192.168.77.5:30053", "10.244.0.3:53", true},  // same port, not a node address
	}
	err := ns.Do(func() error {
		c, err := ct.Dial(nil)
		if err != nil {
			return err
		}
		defer c.Close()
		for _, e := range entries {
			if err := c.Create(flow(e)); err != nil {
				t.Errorf("create %+v: %v", e, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ep := datapath.Endpoint{Addr: netip.MustParseAddrPort("10.244.0.2:53"), Weight: 1}
	// 10.244.0.4 serves but is not planned: a flow to it is live.
	serving := []netip.AddrPort{ep.Addr, netip.MustParseAddrPort("10.244.0.4:53")}
	frontends := []datapath.Frontend{
		{Service: datapath.ServicePortName{Namespace: "kube-system", Name: "dns", Port: "dns"}, Kind: datapath.ClusterIP, Protocol: datapath.UDP, Addr: netip.MustParseAddr("10.96.0.10"), Family: datapath.IPv4, Port: 53, Endpoints: []datapath.Endpoint{ep}, Serving: serving},
		{Service: datapath.ServicePortName{Namespace: "kube-system", Name: "dns", Port: "dns"}, Kind: datapath.NodePort, Protocol: datapath.UDP, Family: datapath.IPv4, Port: 30053, Endpoints: []datapath.Endpoint{ep}, Serving: serving},
		{Service: datapath.ServicePortName{Namespace: "kube-system", Name: "dns", Port: "dns-tcp"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: netip.MustParseAddr("10.96.0.10"), Family: datapath.IPv4, Port: 53},
		{Service: datapath.ServicePortName{Namespace: "default", Name: "empty"}, Kind: datapath.ClusterIP, Protocol: datapath.UDP, Addr: netip.MustParseAddr("10.96.0.11"), Family: datapath.IPv4, Port: 53},
	}
	reg := prometheus.NewRegistry()
	c, err := conntrack.New(conntrack.Options{
		Registerer: reg,
		LocalAddrs: func() ([]netip.Addr, error) { return []netip.Addr{nodeIP}, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := ns.Do(func() (err error) { n, err = c.Reconcile(context.Background(), frontends, false); return err }); err != nil {
		t.Fatal(err)
	}
	var remaining []string
	if err := ns.Do(func() error {
		cc, err := ct.Dial(nil)
		if err != nil {
			return err
		}
		defer cc.Close()
		fs, err := cc.Dump(nil)
		for _, f := range fs {
			remaining = append(remaining, key(f))
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	wantDeleted := 0
	for _, e := range entries {
		k := e.client + ">" + e.orig
		if got := slices.Contains(remaining, k); got != e.wantRemaining {
			t.Errorf("entry %s (reply from %s): remaining=%v, want %v", k, e.reply, got, e.wantRemaining)
		}
		if !e.wantRemaining {
			wantDeleted++
		}
	}
	if n != wantDeleted {
		t.Errorf("Reconcile reported %d deletions, want %d", n, wantDeleted)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, mf := range mfs {
		found[mf.GetName()] = true
		if mf.GetName() == conntrack.MetricDeleted && mf.GetMetric()[0].GetCounter().GetValue() != float64(wantDeleted) {
			t.Errorf("%s = %v, want %d", conntrack.MetricDeleted, mf.GetMetric()[0].GetCounter().GetValue(), wantDeleted)
		}
	}
	if !found[conntrack.MetricDeleted] || !found[conntrack.MetricDuration] {
		t.Errorf("metrics gathered: %v", found)
	}

	// Nothing changed: no pass, even with a new stale entry; force: a pass.
	stale := entry{udp, "10.244.0.9:4010", "10.96.0.10:53", "10.244.0.3:53", false}
	if err := ns.Do(func() error {
		cc, err := ct.Dial(nil)
		if err != nil {
			return err
		}
		defer cc.Close()
		return cc.Create(flow(stale))
	}); err != nil {
		t.Fatal(err)
	}
	for _, force := range []bool{false, true} {
		if err := ns.Do(func() (err error) { n, err = c.Reconcile(context.Background(), frontends, force); return err }); err != nil {
			t.Fatal(err)
		}
		want := 0
		if force {
			want = 1
		}
		if n != want {
			t.Errorf("Reconcile(force=%v) deleted %d, want %d", force, n, want)
		}
	}
}
