package recorder_test

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/recorder"
)

func Example() {
	r := recorder.New()
	p := &datapath.Plan{Frontends: []datapath.Frontend{{
		Service: datapath.ServicePortName{Namespace: "default", Name: "web", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP,
		Addr: netip.MustParseAddr("10.96.0.10"), Family: datapath.IPv4, Port: 80,
		Endpoints: []datapath.Endpoint{{Addr: netip.MustParseAddrPort("10.244.1.5:8080"), Weight: 3}},
	}}}
	fmt.Println(r.Apply(context.Background(), p))
	// A plan that breaks an invariant is refused and not kept.
	bad := &datapath.Plan{Frontends: []datapath.Frontend{{Service: datapath.ServicePortName{Namespace: "x", Name: "y"}, Kind: datapath.ClusterIP, Protocol: "ICMP", Addr: netip.MustParseAddr("10.96.0.11"), Family: datapath.IPv4, Port: 1}}}
	fmt.Println(r.Apply(context.Background(), bad))
	last, n := r.Last()
	fmt.Print(n, " ", last.String())
	// Output:
	// <nil>
	// datapath: invalid plan: frontend ICMP 10.96.0.11:1 (x/y): unknown protocol "ICMP"
	// 1 TCP  10.96.0.10:80 ClusterIP default/web:http -> 10.244.1.5:8080 w=3
}
