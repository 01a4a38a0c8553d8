package state

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"

	"github.com/edgeproxy/edgeproxy/agent/model"
)

func svc(name string, ports ...model.ServicePort) *model.Service {
	return &model.Service{Namespace: "ns", Name: name, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")}, Ports: ports}
}

func slice(name, svcName string, fam model.Family, port model.EndpointPort, eps ...model.Endpoint) *model.EndpointSlice {
	return &model.EndpointSlice{Namespace: "ns", Name: name, Service: svcName, Family: fam, Ports: []model.EndpointPort{port}, Endpoints: eps}
}

func ep(addr string, ready bool) model.Endpoint {
	return model.Endpoint{Addr: netip.MustParseAddr(addr), Ready: ready, Serving: ready}
}

func TestMergeAcrossSlicesDedupAndFamilies(t *testing.T) {
	pokes := 0
	s := New(func() { pokes++ })
	http := model.ServicePort{Name: "http", Protocol: "TCP", Port: 80}
	s.SetService("ns/web", svc("web", http))
	p := model.EndpointPort{Name: "http", Protocol: "TCP", Port: 8080}
	s.SetSlice("ns/web-a", slice("web-a", "web", model.IPv4, p, ep("10.0.0.2", true), ep("10.0.0.1", false)))
	// The same address in a second slice, ready there: kept once, as ready.
	s.SetSlice("ns/web-b", slice("web-b", "web", model.IPv4, p, ep("10.0.0.1", true), ep("10.0.0.3", true)))
	s.SetSlice("ns/web-6", slice("web-6", "web", model.IPv6, p, ep("fd00::1", true)))
	// A slice port of another protocol does not belong to this service port.
	s.SetSlice("ns/web-udp", slice("web-udp", "web", model.IPv4, model.EndpointPort{Name: "http", Protocol: "UDP", Port: 53}, ep("10.0.0.9", true)))

	snap := s.Snapshot()
	name := model.ServicePortName{Namespace: "ns", Name: "web", Port: "http"}
	port := snap.Ports[name]
	if port == nil {
		t.Fatalf("no port %s in snapshot", name)
	}
	var got []string
	for _, e := range port.V4 {
		got = append(got, e.AddrPort().String())
		if e.Addr == netip.MustParseAddr("10.0.0.1") && !e.Ready {
			t.Errorf("duplicate 10.0.0.1 kept the not-ready entry")
		}
	}
	want := []string{"10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"}
	if len(got) != len(want) {
		t.Fatalf("v4 endpoints = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("v4 endpoints = %v, want %v", got, want)
		}
	}
	if len(port.V6) != 1 || port.V6[0].AddrPort().String() != "[fd00::1]:8080" {
		t.Fatalf("v6 endpoints = %v", port.V6)
	}
	if !snap.Changed[name] || snap.Generation != 1 {
		t.Fatalf("changed=%v generation=%d, want changed and generation 1", snap.Changed, snap.Generation)
	}
	if pokes != 5 {
		t.Errorf("notify called %d times, want 5", pokes)
	}
}

func TestNoOpUpdatesAreDropped(t *testing.T) {
	pokes := 0
	s := New(func() { pokes++ })
	http := model.ServicePort{Name: "", Protocol: "TCP", Port: 80}
	s.SetService("ns/a", svc("a", http))
	s.Snapshot()
	s.SetService("ns/a", svc("a", http)) // equal value: no-op
	if pokes != 1 {
		t.Fatalf("no-op update poked the runner: %d pokes", pokes)
	}
	snap := s.Snapshot()
	if len(snap.Changed) != 0 || snap.Generation != 1 {
		t.Fatalf("no-op produced changes %v at generation %d", snap.Changed, snap.Generation)
	}
}

func TestChangedOnlyTouchedPorts(t *testing.T) {
	s := New(nil)
	p := model.ServicePort{Protocol: "TCP", Port: 80}
	s.SetService("ns/a", svc("a", p))
	s.SetService("ns/b", svc("b", p))
	first := s.Snapshot()
	s.SetSlice("ns/b-1", slice("b-1", "b", model.IPv4, model.EndpointPort{Protocol: "TCP", Port: 80}, ep("10.0.0.5", true)))
	snap := s.Snapshot()
	a := model.ServicePortName{Namespace: "ns", Name: "a"}
	b := model.ServicePortName{Namespace: "ns", Name: "b"}
	if snap.Changed[a] || !snap.Changed[b] || len(snap.Changed) != 1 {
		t.Fatalf("changed = %v, want only %s", snap.Changed, b)
	}
	if snap.Ports[a] != first.Ports[a] {
		t.Errorf("unchanged port was rebuilt instead of shared")
	}
	// Deleting the service removes its port and marks it changed.
	s.SetService("ns/b", nil)
	snap = s.Snapshot()
	if _, ok := snap.Ports[b]; ok || !snap.Changed[b] {
		t.Fatalf("deleted service: port present=%v changed=%v", ok, snap.Changed[b])
	}
	// A slice that moves to another service marks both.
	s.SetService("ns/b", svc("b", p))
	s.SetSlice("ns/b-1", slice("b-1", "a", model.IPv4, model.EndpointPort{Protocol: "TCP", Port: 80}, ep("10.0.0.5", true)))
	snap = s.Snapshot()
	if !snap.Changed[a] || len(snap.Ports[a].V4) != 1 || len(snap.Ports[b].V4) != 0 {
		t.Fatalf("slice move: changed=%v a=%v b=%v", snap.Changed, snap.Ports[a].V4, snap.Ports[b].V4)
	}
}

func TestNodeChangeIsReported(t *testing.T) {
	s := New(nil)
	s.SetNode(&model.Node{Name: "n1", Zone: "a"})
	if !s.Snapshot().NodeChanged {
		t.Fatal("first node not reported as changed")
	}
	s.SetNode(&model.Node{Name: "n1", Zone: "a"})
	if s.Snapshot().NodeChanged {
		t.Fatal("identical node reported as changed")
	}
	if !s.Pending().IsZero() {
		t.Fatal("pending change left after snapshot")
	}
}

// Pending counts are kube-proxy's *_changes_pending: Services with Service
// or endpoint changes not yet folded into a snapshot.
func TestChangesPending(t *testing.T) {
	s := New(nil)
	s.SetService("ns/a", &model.Service{Namespace: "ns", Name: "a"})
	s.SetService("ns/b", &model.Service{Namespace: "ns", Name: "b"})
	s.SetSlice("ns/a-1", &model.EndpointSlice{Namespace: "ns", Name: "a-1", Service: "a"})
	s.SetSlice("ns/a-2", &model.EndpointSlice{Namespace: "ns", Name: "a-2", Service: "a"})
	if c := s.Counters(); c.ServicesPending != 2 || c.EndpointsPending != 1 {
		t.Fatalf("pending %d services, %d endpoints; want 2 and 1", c.ServicesPending, c.EndpointsPending)
	}
	s.Snapshot()
	if c := s.Counters(); c.ServicesPending != 0 || c.EndpointsPending != 0 {
		t.Fatalf("after a snapshot: pending %d services, %d endpoints; want 0", c.ServicesPending, c.EndpointsPending)
	}
}

// fillCold sets n services of two ports with one slice of 10 endpoints
// each: what a cold start hands the state before its first snapshot.
func fillCold(s *State, n int) {
	ports := []model.ServicePort{{Name: "http", Protocol: "TCP", Port: 80}, {Name: "https", Protocol: "TCP", Port: 443}}
	for i := range n {
		name := fmt.Sprint("svc-", i)
		s.SetService("ns/"+name, &model.Service{Namespace: "ns", Name: name,
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})}, Ports: ports})
		sl := &model.EndpointSlice{Namespace: "ns", Name: name + "-1", Service: name, Family: model.IPv4,
			Ports: []model.EndpointPort{{Name: "http", Protocol: "TCP", Port: 8080}, {Name: "https", Protocol: "TCP", Port: 8443}}}
		for j := range 10 {
			sl.Endpoints = append(sl.Endpoints, model.Endpoint{Addr: netip.AddrFrom4([4]byte{10, byte(i >> 12), byte(i >> 4), byte(16*(i&15) + j)}), Ready: true, Serving: true})
		}
		s.SetSlice("ns/"+name+"-1", sl)
	}
}

// BenchmarkSnapshotCold20k is the first snapshot after 20,000 services
// (40,000 ports) arrived: every service is dirty at once.
func BenchmarkSnapshotCold20k(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		s := New(nil)
		fillCold(s, 20000)
		b.StartTimer()
		if snap := s.Snapshot(); len(snap.Changed) != 40000 {
			b.Fatalf("%d ports changed, want 40000", len(snap.Changed))
		}
	}
}

// A port dropped from a Service that stays is gone from the next snapshot
// and changed, as is the port that replaced it (and the one kept: its
// Service differs); the other services' ports are shared with the
// previous snapshot.
func TestPortReplacedInService(t *testing.T) {
	s := New(nil)
	http := model.ServicePort{Name: "http", Protocol: "TCP", Port: 80}
	s.SetService("ns/web", svc("web", http, model.ServicePort{Name: "admin", Protocol: "TCP", Port: 81}))
	s.SetService("ns/db", svc("db", model.ServicePort{Name: "sql", Protocol: "TCP", Port: 5432}))
	first := s.Snapshot()
	s.SetService("ns/web", svc("web", http, model.ServicePort{Name: "metrics", Protocol: "TCP", Port: 82}))
	snap := s.Snapshot()
	name := func(svc, port string) model.ServicePortName {
		return model.ServicePortName{Namespace: "ns", Name: svc, Port: port}
	}
	if _, ok := snap.Ports[name("web", "admin")]; ok {
		t.Fatalf("removed port still in snapshot: %v", snap.Ports)
	}
	want := map[model.ServicePortName]bool{name("web", "admin"): true, name("web", "metrics"): true, name("web", "http"): true}
	if !reflect.DeepEqual(snap.Changed, want) || len(snap.Ports) != 3 {
		t.Fatalf("changed = %v (ports %d), want %v (3 ports)", snap.Changed, len(snap.Ports), want)
	}
	if snap.Ports[name("db", "sql")] != first.Ports[name("db", "sql")] {
		t.Fatal("an untouched service's port was rebuilt")
	}
}

// A service's slices are merged in key order whatever order they arrived
// in (of two equal duplicates, the first slice's is kept), and a slice
// that is deleted or moves to another service leaves its old one.
func TestSlicesDeletedAndMoved(t *testing.T) {
	s := New(nil)
	http := model.ServicePort{Name: "http", Protocol: "TCP", Port: 80}
	s.SetService("ns/web", svc("web", http))
	s.SetService("ns/api", svc("api", http))
	p := model.EndpointPort{Name: "http", Protocol: "TCP", Port: 8080}
	onNode := func(addr, node string) model.Endpoint {
		e := ep(addr, true)
		e.NodeName = node
		return e
	}
	s.SetSlice("ns/web-c", slice("web-c", "web", model.IPv4, p, onNode("10.0.0.1", "c"), onNode("10.0.0.3", "c")))
	s.SetSlice("ns/web-a", slice("web-a", "web", model.IPv4, p, onNode("10.0.0.1", "a")))
	s.SetSlice("ns/web-b", slice("web-b", "web", model.IPv4, p, onNode("10.0.0.2", "b")))
	web := model.ServicePortName{Namespace: "ns", Name: "web", Port: "http"}
	api := model.ServicePortName{Namespace: "ns", Name: "api", Port: "http"}
	show := func(snap *Snapshot, name model.ServicePortName) string {
		var out []string
		for _, e := range snap.Ports[name].V4 {
			out = append(out, e.AddrPort().String()+"@"+e.NodeName)
		}
		return fmt.Sprint(out)
	}
	if got, want := show(s.Snapshot(), web), "[10.0.0.1:8080@a 10.0.0.2:8080@b 10.0.0.3:8080@c]"; got != want {
		t.Fatalf("web = %s, want %s", got, want)
	}
	s.SetSlice("ns/web-a", nil)
	if got, want := show(s.Snapshot(), web), "[10.0.0.1:8080@c 10.0.0.2:8080@b 10.0.0.3:8080@c]"; got != want {
		t.Fatalf("web-a deleted: web = %s, want %s", got, want)
	}
	s.SetSlice("ns/web-b", slice("web-b", "api", model.IPv4, p, onNode("10.0.0.2", "b")))
	snap := s.Snapshot()
	if got, want := show(snap, web), "[10.0.0.1:8080@c 10.0.0.3:8080@c]"; got != want {
		t.Errorf("web-b moved to api: web = %s, want %s", got, want)
	}
	if got, want := show(snap, api), "[10.0.0.2:8080@b]"; got != want {
		t.Errorf("web-b moved to api: api = %s, want %s", got, want)
	}
	if !snap.Changed[web] || !snap.Changed[api] {
		t.Errorf("changed = %v, want web and api", snap.Changed)
	}
}
