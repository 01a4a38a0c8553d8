package nftables

import (
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath"
)

// TestInputHashSeesEveryField changes each field of a frontend, of its
// endpoints and of its service port name in turn: each change must change
// the hash, and every field must have its change here, so that a field
// added to datapath.Frontend fails this test until inputHash reads it.
func TestInputHashSeesEveryField(t *testing.T) {
	base := func() datapath.Frontend {
		return datapath.Frontend{
			Service:        datapath.ServicePortName{Namespace: "ns", Name: "web", Port: "http"},
			Kind:           datapath.LoadBalancer,
			Protocol:       datapath.TCP,
			Addr:           netip.MustParseAddr("192.0.2.10"),
			Family:         datapath.IPv4,
			Port:           80,
			Endpoints:      []datapath.Endpoint{{Addr: netip.MustParseAddrPort("10.0.0.1:8080"), Weight: 1}},
			Cluster:        []datapath.Endpoint{{Addr: netip.MustParseAddrPort("10.0.0.2:8080"), Weight: 1}},
			Serving:        []netip.AddrPort{netip.MustParseAddrPort("10.0.0.1:8080")},
			Affinity:       time.Hour,
			SourceRanges:   []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")},
			Scheduler:      "rr",
			SchedulerFlags: []string{"flag-1"},
		}
	}
	ep := func(f *datapath.Frontend) *datapath.Endpoint { return &f.Endpoints[0] }
	changes := map[string]func(f *datapath.Frontend){
		"Service.Namespace":    func(f *datapath.Frontend) { f.Service.Namespace = "other" },
		"Service.Name":         func(f *datapath.Frontend) { f.Service.Name = "api" },
		"Service.Port":         func(f *datapath.Frontend) { f.Service.Port = "https" },
		"Kind":                 func(f *datapath.Frontend) { f.Kind = datapath.ClusterIP },
		"Protocol":             func(f *datapath.Frontend) { f.Protocol = datapath.UDP },
		"Addr":                 func(f *datapath.Frontend) { f.Addr = netip.MustParseAddr("192.0.2.11") },
		"Family":               func(f *datapath.Frontend) { f.Family = datapath.IPv6 },
		"Port":                 func(f *datapath.Frontend) { f.Port = 81 },
		"Endpoints":            func(f *datapath.Frontend) { f.Endpoints = append(f.Endpoints, f.Cluster[0]) },
		"Endpoints.Addr":       func(f *datapath.Frontend) { ep(f).Addr = netip.MustParseAddrPort("10.0.0.1:8081") },
		"Endpoints.Weight":     func(f *datapath.Frontend) { ep(f).Weight = 2 },
		"Endpoints.Local":      func(f *datapath.Frontend) { ep(f).Local = true },
		"Drop":                 func(f *datapath.Frontend) { f.Drop = true },
		"LocalOnly":            func(f *datapath.Frontend) { f.LocalOnly = true },
		"Cluster":              func(f *datapath.Frontend) { f.Cluster = nil },
		"Serving":              func(f *datapath.Frontend) { f.Serving[0] = netip.MustParseAddrPort("10.0.0.3:8080") },
		"Affinity":             func(f *datapath.Frontend) { f.Affinity = time.Minute },
		"SourceRanges":         func(f *datapath.Frontend) { f.SourceRanges[0] = netip.MustParsePrefix("198.51.100.0/25") },
		"SourceRangesHoldNode": func(f *datapath.Frontend) { f.SourceRangesHoldNode = true },
		"Scheduler":            func(f *datapath.Frontend) { f.Scheduler = "wrr" },
		"SchedulerFlags":       func(f *datapath.Frontend) { f.SchedulerFlags = append(f.SchedulerFlags, "flag-2") },
	}
	var fields []string
	for _, typ := range []struct {
		prefix string
		t      reflect.Type
	}{{"", reflect.TypeFor[datapath.Frontend]()}, {"Service.", reflect.TypeFor[datapath.ServicePortName]()}, {"Endpoints.", reflect.TypeFor[datapath.Endpoint]()}} {
		for f := range typ.t.Fields() {
			if f.Type == reflect.TypeFor[datapath.ServicePortName]() {
				continue // its fields are listed as Service.*
			}
			fields = append(fields, typ.prefix+f.Name)
		}
	}
	for _, name := range fields {
		if _, ok := changes[name]; !ok {
			t.Errorf("no change of %s here: does inputHash read it?", name)
		}
	}
	b := base()
	h0 := inputHash([]datapath.Frontend{b})
	if inputHash([]datapath.Frontend{base()}) != h0 {
		t.Fatal("two equal frontends hash differently")
	}
	names := make([]string, 0, len(changes))
	for n := range changes {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		f := base()
		changes[n](&f)
		if inputHash([]datapath.Frontend{f}) == h0 {
			t.Errorf("changing %s leaves the hash as it was", n)
		}
	}
	if inputHash([]datapath.Frontend{b, b}) == h0 || inputHash(nil) == h0 {
		t.Error("the number of frontends does not change the hash")
	}
}
