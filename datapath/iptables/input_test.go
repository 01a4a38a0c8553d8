package iptables

import (
	"context"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"testing"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// A compare (Plan.Full) renders only the units whose input moved: none
// when nothing did, the one whose endpoints changed behind plan.Changed's
// back, and every unit once the rendering config changed.
func TestCompareRendersOnlyMovedInput(t *testing.T) {
	cfg := Config{Family: datapath.IPv4, MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
	fs := samplePlan()
	f := newFakeFamily(cfg, xtables.NewFake())
	if _, err := f.apply(context.Background(), &datapath.Plan{Frontends: fs, Full: true}, modeRewrite); err != nil {
		t.Fatal(err)
	}
	var rendered []string
	renderHook = func(u *unit) { rendered = append(rendered, u.id.service.String()) }
	defer func() { renderHook = nil }()
	compare := func(t *testing.T) []string {
		t.Helper()
		rendered = nil
		if _, err := f.apply(context.Background(), &datapath.Plan{Frontends: slices.Clone(fs), Full: true}, modeCompare); err != nil {
			t.Fatal(err)
		}
		return slices.Compact(slices.Sorted(slices.Values(rendered)))
	}
	if got := compare(t); len(got) != 0 {
		t.Errorf("a compare of an unchanged plan rendered %v", got)
	}
	for i := range fs {
		if fs[i].Service == SPN("default/web:http") {
			fs[i].Endpoints = fs[i].Endpoints[1:]
		}
	}
	if got := compare(t); !slices.Equal(got, []string{"default/web:http"}) {
		t.Errorf("a compare after one service's endpoints moved rendered %v, want that service", got)
	}
	f.cfg.MasqueradeAll = true
	units := map[datapath.ServicePortName]bool{}
	for _, fr := range fs {
		if fr.Family == cfg.Family {
			units[fr.Service] = true
		}
	}
	if got := compare(t); len(got) != len(units) {
		t.Errorf("a compare after a config change rendered %d services (%v), want all %d", len(got), got, len(units))
	}
}

// sumInput hashes every field of a frontend: a field it left out would let
// a compare keep rules rendered from an old value.
func TestSumInputCoversFrontend(t *testing.T) {
	if n := reflect.TypeFor[datapath.Frontend]().NumField(); n != 16 {
		t.Fatalf("datapath.Frontend has %d fields, sumInput hashes 16: hash the new ones and update this count", n)
	}
	base := datapath.Frontend{Service: SPN("a/b:c"), Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: netip.MustParseAddr("10.96.0.1"),
		Family: datapath.IPv4, Port: 80, Endpoints: []datapath.Endpoint{{Addr: netip.MustParseAddrPort("10.244.0.1:80"), Weight: 1}}}
	changes := map[string]func(f *datapath.Frontend){
		"Service":   func(f *datapath.Frontend) { f.Service = SPN("a/b:d") },
		"Kind":      func(f *datapath.Frontend) { f.Kind = datapath.NodePort },
		"Protocol":  func(f *datapath.Frontend) { f.Protocol = datapath.UDP },
		"Addr":      func(f *datapath.Frontend) { f.Addr = netip.MustParseAddr("10.96.0.2") },
		"Family":    func(f *datapath.Frontend) { f.Family = datapath.IPv6 },
		"Port":      func(f *datapath.Frontend) { f.Port = 81 },
		"Endpoints": func(f *datapath.Frontend) { f.Endpoints = []datapath.Endpoint{{Addr: f.Endpoints[0].Addr, Weight: 2}} },
		"Endpoint Local": func(f *datapath.Frontend) {
			f.Endpoints = []datapath.Endpoint{{Addr: f.Endpoints[0].Addr, Weight: 1, Local: true}}
		},
		"Drop":         func(f *datapath.Frontend) { f.Drop = true },
		"LocalOnly":    func(f *datapath.Frontend) { f.LocalOnly = true },
		"Cluster":      func(f *datapath.Frontend) { f.Cluster = f.Endpoints },
		"Serving":      func(f *datapath.Frontend) { f.Serving = []netip.AddrPort{f.Endpoints[0].Addr} },
		"Affinity":     func(f *datapath.Frontend) { f.Affinity = 1 },
		"SourceRanges": func(f *datapath.Frontend) { f.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")} },
		"SourceRangesHoldNode": func(f *datapath.Frontend) {
			f.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
			f.SourceRangesHoldNode = true
		},
		"Scheduler":      func(f *datapath.Frontend) { f.Scheduler = "sh" },
		"SchedulerFlags": func(f *datapath.Frontend) { f.SchedulerFlags = []string{"flag-1"} },
	}
	want := sumInput(1, []*datapath.Frontend{&base})
	for name, change := range changes {
		f := base
		change(&f)
		if sumInput(1, []*datapath.Frontend{&f}) == want {
			t.Errorf("changing %s leaves the input hash as it was", name)
		}
	}
	if sumInput(2, []*datapath.Frontend{&base}) == want {
		t.Error("the config hash is not in the input hash")
	}
}

// BenchmarkCompare1k is the Go side of a sync.period compare of 1,000
// unchanged service ports of 10 endpoints ("compare": an input hash per
// unit, nothing rendered, nothing restored) beside a render of every unit
// ("render-all": what a compare cost before units kept their input hash).
func BenchmarkCompare1k(b *testing.B) {
	cfg := Config{Family: datapath.IPv4, MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
	var fs []datapath.Frontend
	for i := range 1000 {
		eps := make([]datapath.Endpoint, 10)
		for j := range eps {
			k := i*10 + j
			eps[j] = datapath.Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 128, byte(k >> 8), byte(k)}), 8080), Weight: 1}
		}
		fs = append(fs, datapath.Frontend{Service: SPN("ns/svc" + strconv.Itoa(i) + ":http"), Kind: datapath.ClusterIP, Protocol: datapath.TCP,
			Addr: netip.AddrFrom4([4]byte{172, 20, byte(i >> 8), byte(i)}), Family: datapath.IPv4, Port: 80, Endpoints: eps})
	}
	plan := &datapath.Plan{Frontends: fs, Full: true}
	f := newFakeFamily(cfg, xtables.NewFake())
	if _, err := f.apply(context.Background(), plan, modeRewrite); err != nil {
		b.Fatal(err)
	}
	b.Run("compare", func(b *testing.B) {
		for b.Loop() {
			if st, err := f.apply(context.Background(), plan, modeCompare); err != nil || st.written > 0 {
				b.Fatalf("compare wrote %d units: %v", st.written, err)
			}
		}
	})
	b.Run("render-all", func(b *testing.B) {
		for b.Loop() {
			render(cfg, fs, nil)
		}
	})
}
