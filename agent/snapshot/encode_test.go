package snapshot

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/netip"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/datapath"
)

// TestEncodeIsMarshal: the streamed payload is byte for byte what
// json.Marshal writes for the same snapshot, for every field set and unset
// (nil and empty lists and maps, omitempty fields, HTML characters that
// json escapes, a Changed map of several keys in no order).
func TestEncodeIsMarshal(t *testing.T) {
	a := netip.MustParseAddr
	at := time.Date(2026, 11, 27, 2, 0, 0, 5, time.UTC)
	web := datapath.ServicePortName{Namespace: "default", Name: "web", Port: "http"}
	rich := &Snapshot{
		Written: at,
		Node: model.Node{Name: "edge-1", Zone: "z1", Labels: map[string]string{"b": "2", "a": "<1>"},
			Addresses: []netip.Addr{a("192.168.1.10"), a("2001:db8::10")}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}},
		Services: []model.Service{
			{Namespace: "default", Name: "web", Created: at, ClusterIPs: []netip.Addr{a("10.96.0.10")},
				Annotations: map[string]string{"edgeproxy.io/x": "a&b"}, Affinity: time.Hour,
				Ports: []model.ServicePort{{Name: "http", Protocol: "TCP", Port: 80, NodePort: 30080}}},
			{Namespace: "kube-system", Name: "dns", Ports: []model.ServicePort{{Protocol: "UDP", Port: 53}}},
		},
		Slices: []model.EndpointSlice{{Namespace: "default", Name: "web-1", Service: "web", Family: model.IPv4, TriggerTime: at,
			Ports: []model.EndpointPort{{Name: "http", Protocol: "TCP", Port: 8080}},
			Endpoints: []model.Endpoint{
				{Addr: a("10.244.1.5"), NodeName: "edge-1", Zone: "z1", Ready: true, Serving: true, Hints: &model.Hints{Zones: []string{"z1"}, Nodes: []string{"edge-1"}}},
				{Addr: a("10.244.2.7"), Serving: true, Terminating: true},
			}}},
		Modules: map[string]string{"canary": "ab", "topology": "cd"},
		Plan: datapath.Plan{
			Generation: 7,
			Frontends: []datapath.Frontend{{Service: web, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: a("10.96.0.10"),
				Family: datapath.IPv4, Port: 80, Affinity: time.Hour, SourceRanges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
				Endpoints: []datapath.Endpoint{{Addr: netip.MustParseAddrPort("10.244.1.5:8080"), Weight: 3, Local: true}},
				Serving:   []netip.AddrPort{netip.MustParseAddrPort("10.244.1.5:8080")}}},
			Changed: map[datapath.ServicePortName]bool{web: true, {Namespace: "kube-system", Name: "dns"}: false,
				{Namespace: "a", Name: "z"}: true, {Namespace: "default", Name: "web", Port: "https"}: true},
			Full: true, NodeIPs: []netip.Addr{a("192.168.1.10")}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")},
			HealthCheckPorts: []uint16{32000, 32001},
		},
		Resume: map[string]string{"services": "12", "slices": "34"},
	}
	for name, s := range map[string]*Snapshot{
		"rich":    rich,
		"minimal": {Written: at},
		"empty": {Written: at, Services: []model.Service{}, Slices: []model.EndpointSlice{}, Modules: map[string]string{},
			Resume: map[string]string{}, Plan: datapath.Plan{Frontends: []datapath.Frontend{}, Changed: map[datapath.ServicePortName]bool{},
				NodeIPs: []netip.Addr{}, PodCIDRs: []netip.Prefix{}, HealthCheckPorts: []uint16{}}},
	} {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		e := &encoder{w: bufio.NewWriter(&got)}
		e.snapshot(s)
		if e.err != nil {
			t.Fatalf("%s: %v", name, e.err)
		}
		if err := e.w.Flush(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), want) {
			t.Errorf("%s: streamed\n%s\njson.Marshal\n%s", name, got.Bytes(), want)
		}
	}
}
