package planner_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/agent/planner"
	"github.com/edgeproxy/edgeproxy/agent/source"
	"github.com/edgeproxy/edgeproxy/agent/state"
	"github.com/edgeproxy/edgeproxy/datapath"
)

var update = flag.Bool("update", false, "rewrite golden files")

// loadDemo feeds the bundled demo manifests through the real manifest
// source into a state, so the golden plan also keeps configs/demo honest.
func loadDemo(t *testing.T) *state.State {
	t.Helper()
	st := state.New(nil)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	d, err := source.NewDir(filepath.Join("..", "..", "configs", "demo"), "demo-node", &source.Converter{ProxyName: "edgeproxy"}, st, quiet, nil)
	if err != nil {
		t.Fatal(err)
	}
	d.Load()
	return st
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("plan differs from %s (run with -update if intended):\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

func TestDemoPlanGolden(t *testing.T) {
	st := loadDemo(t)
	p := planner.New(planner.Options{}, nil)
	res := p.Build(context.Background(), st.Snapshot())
	if err := res.Plan.Validate(); err != nil {
		t.Fatal(err)
	}
	golden(t, "demo.golden", res.Plan.String())
	// The LoadBalancer service with externalTrafficPolicy Local gets a
	// health check port reporting its one local endpoint.
	if hc := res.HealthChecks[32000]; hc.Namespace != "plant" || hc.Name != "scada-gw" || hc.LocalEndpoints != 1 {
		t.Errorf("health check 32000 = %+v, want plant/scada-gw with 1 local endpoint", hc)
	}
	// ExternalIPs stay off unless enabled.
	if strings.Contains(res.Plan.String(), "ExternalIP") {
		t.Errorf("ExternalIP frontends without the setting")
	}
}

// threeToOne weighs the first endpoint 3 and the rest 1, and names a
// scheduler. calls counts requests, batches calls.
type threeToOne struct{ calls, batches int }

func (p *threeToOne) Weigh(_ context.Context, reqs []planner.Request) []planner.Weighing {
	p.batches++
	var out []planner.Weighing
	for _, r := range reqs {
		p.calls++
		out = append(out, planner.Weighing{Weights: firstThen(len(r.Endpoints), 3), Scheduler: "wrr", Explain: "first gets 3"})
	}
	return out
}

func TestPolicyWeightsAndPartialRebuild(t *testing.T) {
	st := loadDemo(t)
	pol := &threeToOne{}
	p := planner.New(planner.Options{}, pol)
	first := p.Build(context.Background(), st.Snapshot())
	if !strings.Contains(first.Plan.String(), "TCP  10.96.0.20:80 ClusterIP shop/web:http sched=wrr -> 10.244.1.11:8080 w=3, 10.244.2.12:8080 w=1") {
		t.Errorf("policy weights not in plan:\n%s", first.Plan)
	}
	if first.Evaluated != 5 || len(first.Plan.Changed) != 5 {
		t.Errorf("first build evaluated %d ports, changed %d; want 5 and 5", first.Evaluated, len(first.Plan.Changed))
	}
	// Every port with endpoints, handed to the policy in one call.
	if pol.batches != 1 || pol.calls < 2 {
		t.Errorf("first build: %d policy calls for %d requests, want one call for all", pol.batches, pol.calls)
	}

	// One service changes: only its ports are evaluated again.
	calls := pol.calls
	st.SetService("kube-system/dns", nil)
	second := p.Build(context.Background(), st.Snapshot())
	if second.Evaluated != 0 || pol.calls != calls {
		t.Errorf("deleting a service evaluated %d ports and called the policy %d times; want 0", second.Evaluated, pol.calls-calls)
	}
	if !second.Plan.Changed[model.ServicePortName{Namespace: "kube-system", Name: "dns", Port: "dns"}] || !second.Plan.Changed[model.ServicePortName{Namespace: "kube-system", Name: "dns", Port: "dns-tcp"}] || len(second.Plan.Changed) != 2 {
		t.Errorf("changed = %v, want the two dns ports", second.Plan.Changed)
	}
	if strings.Contains(second.Plan.String(), "kube-system/dns") {
		t.Errorf("deleted service still planned")
	}
	// A node change re-evaluates everything.
	st.SetNode(&model.Node{Name: "demo-node", Zone: "office"})
	third := p.Build(context.Background(), st.Snapshot())
	if third.Evaluated != 3 {
		t.Errorf("node change evaluated %d ports, want 3", third.Evaluated)
	}
}

// failingOnce stands in for a chain whose module failed: its first answer
// is the fallback and asks for a retry.
type failingOnce struct{ calls int }

func (p *failingOnce) Weigh(_ context.Context, reqs []planner.Request) []planner.Weighing {
	var out []planner.Weighing
	for _, r := range reqs {
		p.calls++
		if p.calls == 1 {
			out = append(out, planner.Weighing{Weights: firstThen(len(r.Endpoints), 1), Retry: true})
			continue
		}
		out = append(out, planner.Weighing{Weights: firstThen(len(r.Endpoints), 7)})
	}
	return out
}

func TestFallbackIsRetriedNextSync(t *testing.T) {
	st := state.New(nil)
	st.SetService("ns/a", &model.Service{Namespace: "ns", Name: "a", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")},
		Ports: []model.ServicePort{{Protocol: "TCP", Port: 80}}})
	st.SetSlice("ns/a-1", &model.EndpointSlice{Namespace: "ns", Name: "a-1", Service: "a", Family: model.IPv4,
		Ports:     []model.EndpointPort{{Protocol: "TCP", Port: 80}},
		Endpoints: []model.Endpoint{{Addr: netip.MustParseAddr("10.0.0.1"), Ready: true, Serving: true}}})
	pol := &failingOnce{}
	p := planner.New(planner.Options{}, pol)
	first := p.Build(context.Background(), st.Snapshot())
	if !strings.Contains(first.Plan.String(), "10.0.0.1:80 w=1") {
		t.Fatalf("first plan:\n%s", first.Plan)
	}
	// Nothing changed, but the port fell back: it is weighed again.
	second := p.Build(context.Background(), st.Snapshot())
	if second.Evaluated != 1 || !strings.Contains(second.Plan.String(), "10.0.0.1:80 w=7") {
		t.Fatalf("retry: evaluated %d\n%s", second.Evaluated, second.Plan)
	}
	// Now it succeeded: no more re-evaluation.
	if third := p.Build(context.Background(), st.Snapshot()); third.Evaluated != 0 {
		t.Fatalf("evaluated %d ports after a success, want 0", third.Evaluated)
	}
}

// With both traffic policies Local, the ClusterIP gets the local set but
// the external frontends still carry the cluster-wide set for pod and node
// traffic (kube-proxy's short-circuit), and no endpoint anywhere refuses
// rather than drops.
func TestShortCircuitAndDrop(t *testing.T) {
	st := state.New(nil)
	st.SetNode(&model.Node{Name: "n1"})
	svc := &model.Service{Namespace: "ns", Name: "a", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")},
		InternalLocal: true, ExternalLocal: true,
		Ports: []model.ServicePort{{Protocol: "TCP", Port: 80, NodePort: 30080}}}
	st.SetService("ns/a", svc)
	st.SetSlice("ns/a-1", &model.EndpointSlice{Namespace: "ns", Name: "a-1", Service: "a", Family: model.IPv4,
		Ports: []model.EndpointPort{{Protocol: "TCP", Port: 80}},
		Endpoints: []model.Endpoint{
			{Addr: netip.MustParseAddr("10.0.0.1"), Ready: true, Serving: true, NodeName: "n1"},
			{Addr: netip.MustParseAddr("10.0.0.2"), Ready: true, Serving: true, NodeName: "n2"},
		}})
	p := planner.New(planner.Options{}, nil)
	got := p.Build(context.Background(), st.Snapshot()).Plan.String()
	want := "TCP  10.96.0.1:80 ClusterIP ns/a -> 10.0.0.1:80 w=1\n" +
		"TCP  *:30080 NodePort ns/a local -> 10.0.0.1:80 w=1 | short-circuit -> 10.0.0.1:80 w=1, 10.0.0.2:80 w=1\n"
	if got != want {
		t.Errorf("plan:\n%s\nwant:\n%s", got, want)
	}

	// Only the remote endpoint: dropped (Local policies), not refused.
	st.SetSlice("ns/a-1", &model.EndpointSlice{Namespace: "ns", Name: "a-1", Service: "a", Family: model.IPv4,
		Ports:     []model.EndpointPort{{Protocol: "TCP", Port: 80}},
		Endpoints: []model.Endpoint{{Addr: netip.MustParseAddr("10.0.0.2"), Ready: true, Serving: true, NodeName: "n2"}}})
	got = p.Build(context.Background(), st.Snapshot()).Plan.String()
	want = "TCP  10.96.0.1:80 ClusterIP ns/a drop -> (none)\n" +
		"TCP  *:30080 NodePort ns/a local drop -> (none) | short-circuit -> 10.0.0.2:80 w=1\n"
	if got != want {
		t.Errorf("plan:\n%s\nwant:\n%s", got, want)
	}
	// No endpoint at all: refused.
	st.SetSlice("ns/a-1", nil)
	got = p.Build(context.Background(), st.Snapshot()).Plan.String()
	want = "TCP  10.96.0.1:80 ClusterIP ns/a -> (none)\n" +
		"TCP  *:30080 NodePort ns/a local -> (none)\n"
	if got != want {
		t.Errorf("plan:\n%s\nwant:\n%s", got, want)
	}
}

// UDP frontends carry every serving endpoint for conntrack cleanup, also
// the terminating-but-serving ones the selection left out.
func TestServingForConntrack(t *testing.T) {
	st := state.New(nil)
	st.SetService("ns/dns", &model.Service{Namespace: "ns", Name: "dns", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Ports: []model.ServicePort{{Protocol: "UDP", Port: 53}}})
	st.SetSlice("ns/dns-1", &model.EndpointSlice{Namespace: "ns", Name: "dns-1", Service: "dns", Family: model.IPv4,
		Ports: []model.EndpointPort{{Protocol: "UDP", Port: 53}},
		Endpoints: []model.Endpoint{
			{Addr: netip.MustParseAddr("10.0.0.1"), Ready: true, Serving: true},
			{Addr: netip.MustParseAddr("10.0.0.2"), Serving: true, Terminating: true},
			{Addr: netip.MustParseAddr("10.0.0.3"), Terminating: true},
		}})
	f := planner.New(planner.Options{}, nil).Build(context.Background(), st.Snapshot()).Plan.Frontends[0]
	want := []netip.AddrPort{netip.MustParseAddrPort("10.0.0.1:53"), netip.MustParseAddrPort("10.0.0.2:53")}
	if len(f.Endpoints) != 1 || !slices.Equal(f.Serving, want) {
		t.Errorf("endpoints %v, serving %v; want one endpoint and serving %v", f.Endpoints, f.Serving, want)
	}
}

// firstThen returns n weights: first, then 1 for the rest.
func firstThen(n int, first uint32) []uint32 {
	w := make([]uint32, n)
	for i := range w {
		w[i] = 1
	}
	w[0] = first
	return w
}

// panicking is a policy that panics.
type panicking struct{}

func (panicking) Weigh(context.Context, []planner.Request) []planner.Weighing { panic("policy bug") }

// TestPolicyPanicReachesBuild: the policy runs on a goroutine of Build's,
// but its panic surfaces in Build (where the sync runner recovers it),
// not as a crash of the process.
func TestPolicyPanicReachesBuild(t *testing.T) {
	st := loadDemo(t)
	p := planner.New(planner.Options{}, panicking{})
	defer func() {
		if r := recover(); r != "policy bug" {
			t.Fatalf("recovered %v, want the policy's panic", r)
		}
	}()
	p.Build(context.Background(), st.Snapshot())
	t.Fatal("Build returned")
}

// A dual-stack pod is one local endpoint for the healthCheckNodePort, not
// one per family (kube-proxy answers localEndpoints 1).
func TestHealthCheckCountsDualStackPodOnce(t *testing.T) {
	st := state.New(nil)
	st.SetNode(&model.Node{Name: "n1"})
	st.SetService("ns/a", &model.Service{Namespace: "ns", Name: "a",
		ClusterIPs:    []netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00:96::1")},
		ExternalLocal: true, HealthCheckNodePort: 31000,
		Ports: []model.ServicePort{{Protocol: "TCP", Port: 80, NodePort: 30080}}})
	for _, s := range []struct {
		name string
		fam  model.Family
		addr string
	}{{"a-4", model.IPv4, "10.0.0.1"}, {"a-6", model.IPv6, "fd00::1"}} {
		st.SetSlice("ns/"+s.name, &model.EndpointSlice{Namespace: "ns", Name: s.name, Service: "a", Family: s.fam,
			Ports:     []model.EndpointPort{{Protocol: "TCP", Port: 80}},
			Endpoints: []model.Endpoint{{Addr: netip.MustParseAddr(s.addr), Ready: true, Serving: true, NodeName: "n1"}}})
	}
	res := planner.New(planner.Options{}, nil).Build(context.Background(), st.Snapshot())
	if got := res.HealthChecks[31000].LocalEndpoints; got != 1 {
		t.Errorf("local endpoints %d, want 1 (one dual-stack pod)", got)
	}
}

// explainJSON is every port's explanation in res, as /debug/plan shows it.
func explainJSON(t *testing.T, res *planner.Result) string {
	t.Helper()
	b, err := json.MarshalIndent(res.Explains(nil), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b) + "\n"
}

// The explanations of the demo with a policy, and of a dual-stack Service
// with both traffic policies Local and skipped endpoints: what `edgeproxy explain` shows. A result's
// explanations stay those of its own Build after the next one, and a port
// the next Build reused explains the same.
func TestExplainGolden(t *testing.T) {
	st := loadDemo(t)
	st.SetService("ns/a", &model.Service{Namespace: "ns", Name: "a", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.9.1"), netip.MustParseAddr("fd00:96::9")},
		InternalLocal: true, ExternalLocal: true, HealthCheckNodePort: 31999,
		Ports: []model.ServicePort{{Protocol: "TCP", Port: 80, NodePort: 30999}}})
	st.SetSlice("ns/a-1", &model.EndpointSlice{Namespace: "ns", Name: "a-1", Service: "a", Family: model.IPv4,
		Ports: []model.EndpointPort{{Protocol: "TCP", Port: 80}},
		Endpoints: []model.Endpoint{
			{Addr: netip.MustParseAddr("10.0.9.1"), Ready: true, Serving: true, NodeName: "demo-node"},
			{Addr: netip.MustParseAddr("10.0.9.2"), Ready: true, Serving: true, NodeName: "elsewhere"},
			{Addr: netip.MustParseAddr("10.0.9.3"), Serving: true, Terminating: true, NodeName: "demo-node"},
		}})
	st.SetSlice("ns/a-2", &model.EndpointSlice{Namespace: "ns", Name: "a-2", Service: "a", Family: model.IPv6,
		Ports:     []model.EndpointPort{{Protocol: "TCP", Port: 80}},
		Endpoints: []model.Endpoint{{Addr: netip.MustParseAddr("fd00::9:1"), Ready: true, Serving: true, NodeName: "demo-node"}}})
	p := planner.New(planner.Options{}, &threeToOne{})
	first := p.Build(context.Background(), st.Snapshot())
	want := explainJSON(t, first)
	golden(t, "explain.golden", want)

	st.SetService("kube-system/dns", nil)
	second := p.Build(context.Background(), st.Snapshot())
	if got := explainJSON(t, first); got != want {
		t.Errorf("the first result's explanations changed with the second Build:\n%s", got)
	}
	var before, after map[string]json.RawMessage
	if err := json.Unmarshal([]byte(want), &before); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(explainJSON(t, second)), &after); err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before)-2 {
		t.Errorf("second build explains %d ports, want %d (the two dns ports gone)", len(after), len(before)-2)
	}
	for name, ex := range after {
		if string(ex) != string(before[name]) {
			t.Errorf("%s explained differently after a Build that reused it:\n%s\nwas:\n%s", name, ex, before[name])
		}
	}
}

// A published result is explained (HTTP) while the planner builds the next
// ones: what it explains does not move (run with -race to see the reads
// and writes do not meet).
func TestExplainWhileBuilding(t *testing.T) {
	st := loadDemo(t)
	p := planner.New(planner.Options{}, &threeToOne{})
	first := p.Build(context.Background(), st.Snapshot())
	want := explainJSON(t, first)
	done := make(chan string)
	go func() {
		defer close(done)
		for range 20 {
			b, err := json.MarshalIndent(first.Explains(nil), "", "  ")
			if got := string(b) + "\n"; err != nil || got != want {
				done <- fmt.Sprint(got, err)
				return
			}
		}
	}()
	for i := range 20 {
		st.SetNode(&model.Node{Name: "demo-node", Zone: fmt.Sprint("zone-", i)})
		p.Invalidate()
		p.Build(context.Background(), st.Snapshot())
	}
	if got, changed := <-done; changed {
		t.Errorf("explained while building:\n%s\nwant:\n%s", got, want)
	}
}

// The Node's pod ranges reach the plan (detectLocalMode NodeCIDR tells
// this node's pods by them), and follow the Node.
func TestPlanCarriesPodCIDRs(t *testing.T) {
	st := state.New(nil)
	cidrs := []netip.Prefix{netip.MustParsePrefix("10.244.3.0/24"), netip.MustParsePrefix("fd00:244:3::/64")}
	st.SetNode(&model.Node{Name: "n1", PodCIDRs: cidrs})
	p := planner.New(planner.Options{}, nil)
	if got := p.Build(context.Background(), st.Snapshot()).Plan.PodCIDRs; !slices.Equal(got, cidrs) {
		t.Errorf("plan's PodCIDRs %v, want the Node's %v", got, cidrs)
	}
	st.SetNode(&model.Node{Name: "n1", PodCIDRs: cidrs[1:]})
	if got := p.Build(context.Background(), st.Snapshot()).Plan.PodCIDRs; !slices.Equal(got, cidrs[1:]) {
		t.Errorf("after the Node changed: %v, want %v", got, cidrs[1:])
	}
}

// A load balancer whose source ranges hold the node's primary address of
// the family lets its own address through (kube-proxy's allowFromNode,
// with its node IP); the flag follows the Node's address when it moves.
func TestSourceRangesHoldNode(t *testing.T) {
	st := state.New(nil)
	st.SetNode(&model.Node{Name: "n1", Addresses: []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("192.168.9.9")}})
	svc := &model.Service{Namespace: "ns", Name: "lb", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")},
		LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("172.30.0.1")},
		SourceRanges:    []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24")},
		Ports:           []model.ServicePort{{Protocol: "TCP", Port: 443}}}
	st.SetService("ns/lb", svc)
	p := planner.New(planner.Options{}, nil)
	lb := func() string {
		for _, f := range p.Build(context.Background(), st.Snapshot()).Plan.Frontends {
			if f.Kind == datapath.LoadBalancer {
				return f.String()
			}
		}
		return "no load balancer frontend"
	}
	if got := lb(); !strings.Contains(got, "from=192.168.1.0/24+self") {
		t.Errorf("node 192.168.1.10 inside the ranges: %q, want the balancer's own address let through", got)
	}
	// Only the primary address counts: the second one is inside, the
	// first is not.
	st.SetNode(&model.Node{Name: "n1", Addresses: []netip.Addr{netip.MustParseAddr("192.168.2.10"), netip.MustParseAddr("192.168.1.11")}})
	if got := lb(); strings.Contains(got, "+self") || !strings.Contains(got, "from=192.168.1.0/24") {
		t.Errorf("primary address 192.168.2.10 outside the ranges: %q, want only the ranges", got)
	}
}

// TestPartialBuildsKeepPlanOrder: the planner lays out a plan from the
// ports it kept and the ports it recomputed without sorting the whole plan
// again. After every kind of change (endpoints moved, ports added and
// removed, a Service whose frontends are not laid out in the plan's order)
// its plan must be the one a new planner builds, in datapath.Plan.Sort's
// order.
func TestPartialBuildsKeepPlanOrder(t *testing.T) {
	st := state.New(nil)
	set := func(i, epByte int) {
		name := fmt.Sprintf("s%03d", i)
		svc := &model.Service{Namespace: "ns", Name: name,
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(i)}), netip.MustParseAddr(fmt.Sprintf("fd00::%x", i))},
			// Laid out LoadBalancer after NodePort, in this order: not
			// the plan's.
			LoadBalancerIPs: []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(200 - i)}), netip.AddrFrom4([4]byte{192, 0, 2, byte(i)})},
			Ports:           []model.ServicePort{{Name: "b", Protocol: "TCP", Port: 80, NodePort: uint16(30000 + i)}, {Name: "a", Protocol: "UDP", Port: 53}}}
		st.SetService("ns/"+name, svc)
		sl := &model.EndpointSlice{Namespace: "ns", Name: name + "-1", Service: name, Family: model.IPv4,
			Ports: []model.EndpointPort{{Name: "b", Protocol: "TCP", Port: 8080}, {Name: "a", Protocol: "UDP", Port: 5353}}}
		for j := range 3 {
			sl.Endpoints = append(sl.Endpoints, model.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 244, byte(epByte), byte(j)}), Ready: true, Serving: true})
		}
		st.SetSlice("ns/"+name+"-1", sl)
	}
	for i := 10; i < 40; i += 2 {
		set(i, i)
	}
	p := planner.New(planner.Options{}, nil)
	check := func(step string) {
		t.Helper()
		snap := st.Snapshot()
		got := p.Build(context.Background(), snap).Plan
		want := planner.New(planner.Options{}, nil).Build(context.Background(), snap).Plan
		sorted := slices.Clone(got.Frontends)
		(&datapath.Plan{Frontends: sorted}).Sort()
		if got.String() != want.String() || got.String() != (&datapath.Plan{Frontends: sorted}).String() {
			t.Fatalf("%s: plan\n%s\nwant\n%s", step, got, want)
		}
		if len(got.Frontends) == 0 {
			t.Fatalf("%s: empty plan", step)
		}
	}
	check("first")
	set(20, 99)
	check("endpoints moved")
	set(21, 21)
	set(9, 9)
	check("services added")
	st.SetService("ns/s030", nil)
	check("service removed")
	set(30, 1)
	st.SetService("ns/s012", nil)
	set(12, 12)
	st.SetService("ns/s014", nil)
	check("added, removed and changed at once")
	if got := p.Build(context.Background(), st.Snapshot()); got.Evaluated != 0 || len(got.Plan.Changed) != 0 {
		t.Errorf("unchanged snapshot: evaluated %d, changed %v", got.Evaluated, got.Plan.Changed)
	}

	// A snapshot that claims to follow the last one planned but brings a
	// port it does not mark changed is planned whole.
	snap := st.Snapshot()
	p.Build(context.Background(), snap)
	set(50, 50)
	extra := st.Snapshot()
	lying := &state.Snapshot{Generation: snap.Generation + 1, Node: extra.Node, Ports: extra.Ports, Changed: map[model.ServicePortName]bool{}}
	got := p.Build(context.Background(), lying).Plan
	want := planner.New(planner.Options{}, nil).Build(context.Background(), lying).Plan
	if got.String() != want.String() {
		t.Fatalf("unmarked port: plan\n%s\nwant\n%s", got, want)
	}
	if name := (model.ServicePortName{Namespace: "ns", Name: "s050", Port: "a"}); !got.Changed[name] {
		t.Errorf("unmarked new port %s not in Changed %v", name, got.Changed)
	}

	p.Invalidate()
	check("invalidated")
}
