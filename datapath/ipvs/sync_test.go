package ipvs

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath"
)

// fakeKernel is an in-memory IPVS table: state, not call recording.
type fakeKernel struct {
	vs    map[Key]VirtualServer
	reals map[Key]map[netip.AddrPort]RealServer
	// refuseVS and refuseReal make the kernel refuse those objects, as
	// netlink does (e.g. an unknown scheduler module, ENOMEM).
	refuseVS   map[Key]error
	refuseReal map[netip.AddrPort]error
	// The connection timeouts as set; zero: the kernel's.
	tcp, tcpFin, udp time.Duration
}

func newFakeKernel() *fakeKernel {
	return &fakeKernel{vs: map[Key]VirtualServer{}, reals: map[Key]map[netip.AddrPort]RealServer{}}
}

func (f *fakeKernel) VirtualServers() ([]VirtualServer, error) {
	var out []VirtualServer
	for _, v := range f.vs {
		out = append(out, v)
	}
	return out, nil
}
func (f *fakeKernel) AddVirtualServer(v VirtualServer) error {
	if err := f.refuseVS[v.Key()]; err != nil {
		return err
	}
	f.vs[v.Key()] = v
	f.reals[v.Key()] = map[netip.AddrPort]RealServer{}
	return nil
}
func (f *fakeKernel) UpdateVirtualServer(v VirtualServer) error { f.vs[v.Key()] = v; return nil }
func (f *fakeKernel) DeleteVirtualServer(v VirtualServer) error {
	delete(f.vs, v.Key())
	delete(f.reals, v.Key())
	return nil
}
func (f *fakeKernel) RealServers(v VirtualServer) ([]RealServer, error) {
	var out []RealServer
	for _, r := range f.reals[v.Key()] {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b RealServer) int { return a.Addr.Compare(b.Addr) })
	return out, nil
}
func (f *fakeKernel) AddRealServer(v VirtualServer, r RealServer) error {
	if err := f.refuseReal[r.Addr]; err != nil {
		return err
	}
	f.reals[v.Key()][r.Addr] = r
	return nil
}
func (f *fakeKernel) UpdateRealServer(v VirtualServer, r RealServer) error {
	old := f.reals[v.Key()][r.Addr]
	r.Active, r.Inactive = old.Active, old.Inactive
	f.reals[v.Key()][r.Addr] = r
	return nil
}
func (f *fakeKernel) DeleteRealServer(v VirtualServer, r RealServer) error {
	delete(f.reals[v.Key()], r.Addr)
	return nil
}
func (f *fakeKernel) SetTimeouts(tcp, tcpFin, udp time.Duration) error {
	for _, t := range []struct {
		to *time.Duration
		v  time.Duration
	}{{&f.tcp, tcp}, {&f.tcpFin, tcpFin}, {&f.udp, udp}} {
		if t.v != 0 { // zero keeps a value, as netlink's
			*t.to = t.v
		}
	}
	return nil
}
func (f *fakeKernel) Close() error { return nil }

func TestSyncServersDrainsAndDeletes(t *testing.T) {
	k := newFakeKernel()
	now := time.Unix(0, 0)
	p, err := New(Options{Kernel: k, GracePeriod: 10 * time.Second, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	vip := netip.MustParseAddr("10.96.0.1")
	a, b := netip.MustParseAddrPort("10.244.0.2:80"), netip.MustParseAddrPort("10.244.0.3:80")
	plan := func(full bool, proto datapath.Protocol, eps ...netip.AddrPort) *datapath.Plan {
		svc := datapath.ServicePortName{Namespace: "ns", Name: "s"}
		f := datapath.Frontend{Service: svc, Kind: datapath.ClusterIP, Protocol: proto, Addr: vip, Family: datapath.IPv4, Port: 80}
		for _, e := range eps {
			f.Endpoints = append(f.Endpoints, datapath.Endpoint{Addr: e, Weight: 1})
		}
		return &datapath.Plan{Full: full, Changed: map[datapath.ServicePortName]bool{svc: true}, Frontends: []datapath.Frontend{f}}
	}
	sync := func(pl *datapath.Plan) Stats {
		t.Helper()
		d, err := compute(config{}, pl)
		if err != nil {
			t.Fatal(err)
		}
		var st Stats
		if pl.Full || !p.synced {
			err = p.fullSyncServers(d, map[netip.Addr]bool{}, nil, &st)
		} else {
			err = p.partialSyncServers(pl, d, &st)
		}
		if err != nil {
			t.Fatal(err)
		}
		p.synced = true
		return st
	}
	key := Key{vip, datapath.TCP, 80}
	sync(plan(true, datapath.TCP, a, b))
	if len(k.reals[key]) != 2 {
		t.Fatalf("reals = %v", k.reals[key])
	}
	// a leaves with a live connection: weight 0, kept.
	r := k.reals[key][a]
	r.Active = 1
	k.reals[key][a] = r
	sync(plan(false, datapath.TCP, b))
	if got := k.reals[key][a]; got.Weight != 0 || len(k.reals[key]) != 2 {
		t.Fatalf("after removal: %v", k.reals[key])
	}
	// Unchanged partial plans still revisit the draining server.
	now = now.Add(5 * time.Second)
	pl := plan(false, datapath.TCP, b)
	pl.Changed = nil
	if st := sync(pl); st.RealServers.Draining != 1 {
		t.Errorf("draining = %+v", st.RealServers)
	}
	// The connection ends: a goes before the grace period is over.
	r = k.reals[key][a]
	r.Active = 0
	k.reals[key][a] = r
	if st := sync(pl); st.RealServers.Deleted != 1 || len(k.reals[key]) != 1 || p.Draining() != 0 {
		t.Errorf("after the connection ended: %+v, reals %v", st.RealServers, k.reals[key])
	}
	// a comes back while it would be draining: weight restored.
	k.reals[key][a] = RealServer{Addr: a, Weight: 0, Active: 3}
	sync(plan(true, datapath.TCP, a, b))
	if got := k.reals[key][a]; got.Weight != 1 {
		t.Errorf("returning endpoint has weight %d, want 1", got.Weight)
	}
	// UDP: deleted at once.
	sync(plan(true, datapath.UDP, a, b))
	ukey := Key{vip, datapath.UDP, 80}
	k.reals[ukey][a] = RealServer{Addr: a, Weight: 1, Active: 5}
	sync(plan(false, datapath.UDP, b))
	if _, still := k.reals[ukey][a]; still {
		t.Error("a UDP real server was kept draining")
	}
	// SCTP: deleted at once too, as kube-proxy does.
	sync(plan(true, datapath.SCTP, a, b))
	skey := Key{vip, datapath.SCTP, 80}
	k.reals[skey][a] = RealServer{Addr: a, Weight: 1, Active: 2}
	sync(plan(false, datapath.SCTP, b))
	if _, still := k.reals[skey][a]; still || p.Draining() != 0 {
		t.Errorf("an SCTP real server was kept draining: %v", k.reals[skey])
	}
	// The TCP frontend left the plan: its virtual server goes (it was ours).
	if _, ok := k.vs[key]; ok {
		t.Error("the TCP virtual server outlived its frontend")
	}
	// A virtual server that is not ours stays.
	foreign := VirtualServer{Addr: netip.MustParseAddr("172.16.0.1"), Protocol: datapath.TCP, Port: 1, Scheduler: "rr"}
	k.AddVirtualServer(foreign)
	sync(plan(true, datapath.UDP, b))
	if _, ok := k.vs[foreign.Key()]; !ok {
		t.Error("a virtual server that edgeproxy never made was deleted")
	}
}

// TestKernelRefusalsArePortErrors: a virtual or real server the kernel
// refuses concerns its service port alone. It comes back as a
// datapath.PortError of that service port, the other services are
// programmed, and the next (partial) sync tries the refused one again.
func TestKernelRefusalsArePortErrors(t *testing.T) {
	k := newFakeKernel()
	p, err := New(Options{Kernel: k})
	if err != nil {
		t.Fatal(err)
	}
	ep := func(s string) datapath.Endpoint {
		return datapath.Endpoint{Addr: netip.MustParseAddrPort(s), Weight: 1}
	}
	fe := func(svc datapath.ServicePortName, vip string, eps ...datapath.Endpoint) datapath.Frontend {
		return datapath.Frontend{Service: svc, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: netip.MustParseAddr(vip), Family: datapath.IPv4, Port: 80, Endpoints: eps}
	}
	goodKey := Key{netip.MustParseAddr("10.96.0.1"), datapath.TCP, 80}
	vsKey := Key{netip.MustParseAddr("10.96.0.2"), datapath.TCP, 80}
	realKey := Key{netip.MustParseAddr("10.96.0.3"), datapath.TCP, 80}
	badReal := netip.MustParseAddrPort("10.244.0.9:80")
	k.refuseVS = map[Key]error{vsKey: errors.New("ipvs: add virtual server: no such file or directory")}
	k.refuseReal = map[netip.AddrPort]error{badReal: errors.New("ipvs: add real server: cannot allocate memory")}
	plan := &datapath.Plan{Full: true, Frontends: []datapath.Frontend{
		fe(datapath.ServicePortName{Namespace: "a", Name: "good", Port: "http"}, "10.96.0.1", ep("10.244.0.2:80")),
		fe(datapath.ServicePortName{Namespace: "a", Name: "vs", Port: "http"}, "10.96.0.2", ep("10.244.0.3:80")),
		fe(datapath.ServicePortName{Namespace: "a", Name: "real", Port: "http"}, "10.96.0.3", ep("10.244.0.4:80"), ep(badReal.String())),
	}}
	d, err := compute(config{}, plan)
	if err != nil {
		t.Fatal(err)
	}
	var st Stats
	err = p.fullSyncServers(d, map[netip.Addr]bool{}, nil, &st)
	ports, rest := datapath.SplitPortErrors(err)
	if rest != nil {
		t.Fatalf("a refused server failed the sync: %v", rest)
	}
	got := map[datapath.ServicePortName]bool{}
	for _, pe := range ports {
		got[pe.Service] = true
	}
	if len(got) != 2 || !got[datapath.ServicePortName{Namespace: "a", Name: "vs", Port: "http"}] || !got[datapath.ServicePortName{Namespace: "a", Name: "real", Port: "http"}] {
		t.Fatalf("port errors for %v, want a/vs:http and a/real:http", got)
	}
	if _, ok := k.vs[goodKey]; !ok || len(k.reals[goodKey]) != 1 {
		t.Errorf("the good service was not programmed: %v", k.vs)
	}
	if _, ok := k.vs[vsKey]; ok {
		t.Errorf("a refused virtual server is in the kernel")
	}
	if len(k.reals[realKey]) != 1 {
		t.Errorf("the real servers the kernel took were not kept: %v", k.reals[realKey])
	}
	// The kernel takes them now: an unchanged partial plan programs both.
	k.refuseVS, k.refuseReal = nil, nil
	p.synced = true
	plan.Full, plan.Changed = false, nil
	if err := p.partialSyncServers(plan, d, &st); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if _, ok := k.vs[vsKey]; !ok {
		t.Error("the refused virtual server was not tried again")
	}
	if len(k.reals[realKey]) != 2 {
		t.Errorf("the refused real server was not tried again: %v", k.reals[realKey])
	}
	if len(p.retry) != 0 {
		t.Errorf("retry = %v after everything was programmed", p.retry)
	}
}
