package selection_test

import (
	"fmt"
	"net/netip"

	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/agent/selection"
)

// A Service with trafficDistribution PreferSameZone whose slices carry no
// hints, seen from node a1 in zone a: the hints are derived from each
// endpoint's zone, so ClusterIP traffic stays in zone a. External traffic
// follows externalTrafficPolicy Local: only the endpoint on a1.
func Example() {
	svc := &model.Service{
		Namespace: "shop", Name: "web",
		TrafficDistribution: model.PreferSameZone,
		ExternalLocal:       true,
	}
	port := model.ServicePort{Protocol: "TCP", Port: 80, NodePort: 30080}
	endpoint := func(addr, node, zone string, ready bool) model.PortEndpoint {
		return model.PortEndpoint{Port: 8080, Endpoint: &model.Endpoint{
			Addr: netip.MustParseAddr(addr), NodeName: node, Zone: zone,
			Ready: ready, Serving: true, Terminating: !ready,
		}}
	}
	eps := []model.PortEndpoint{
		endpoint("10.1.0.5", "a1", "a", true),
		endpoint("10.1.1.5", "a2", "a", true),
		endpoint("10.2.0.5", "b1", "b", true),
		endpoint("10.1.0.6", "a1", "a", false),
	}
	r := selection.Select(svc, port, eps, &model.Node{Name: "a1", Zone: "a"})

	fmt.Println("topology:", r.Topology)
	for _, c := range r.Internal {
		fmt.Println("internal", c.AddrPort(), c.Reason)
	}
	for _, c := range r.InternalSkipped {
		fmt.Println("  skipped", c.AddrPort(), c.Reason)
	}
	for _, c := range r.External {
		fmt.Println("external", c.AddrPort(), c.Reason)
	}
	fmt.Println("local ready:", r.LocalReady)
	for _, n := range r.Notes {
		fmt.Println("note:", n)
	}
	// Output:
	// topology: PreferSameZone
	// internal 10.1.0.5:8080 ready, hinted for this zone
	// internal 10.1.1.5:8080 ready, hinted for this zone
	//   skipped 10.2.0.5:8080 ready, hinted for other zones
	//   skipped 10.1.0.6:8080 terminating (ready endpoints exist)
	// external 10.1.0.5:8080 ready, local
	// local ready: 1
	// note: trafficDistribution PreferSameZone: slices carry no hints, derived from each endpoint's own zone
}
