package nftables_test

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/nftables"
)

// A Proxier programs a plan into the ip (and ip6) edgeproxy tables; the
// first Apply writes them whole, later ones only the changed Services.
// (Not run: it needs root and changes the host's rules.)
func Example() {
	p, err := nftables.New(nftables.Options{
		MasqueradeBit: 14,
		ClusterCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()
	web := datapath.ServicePortName{Namespace: "default", Name: "web", Port: "http"}
	plan := &datapath.Plan{Generation: 1, Full: true, Frontends: []datapath.Frontend{{
		Service: web, Kind: datapath.ClusterIP, Protocol: datapath.TCP,
		Addr: netip.MustParseAddr("10.96.0.10"), Family: datapath.IPv4, Port: 80,
		Endpoints: []datapath.Endpoint{{Addr: netip.MustParseAddrPort("10.244.0.2:8080"), Weight: 1}},
	}}}
	if err := p.Apply(context.Background(), plan); err != nil {
		fmt.Println(err)
		return
	}
	// One Service changed: only its chain and elements are sent.
	plan.Generation, plan.Full = 2, false
	plan.Changed = map[datapath.ServicePortName]bool{web: true}
	plan.Frontends[0].Endpoints = append(plan.Frontends[0].Endpoints, datapath.Endpoint{Addr: netip.MustParseAddrPort("10.244.0.3:8080"), Weight: 1})
	if err := p.Apply(context.Background(), plan); err != nil {
		fmt.Println(err)
	}
	fmt.Println(p.LastStats().Rebuilt)
}
