package ipvs_test

import (
	"context"
	"log"
	"net/netip"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/ipvs"
)

// Program one ClusterIP service with a 3:1 canary split. (Not run by go
// test: it needs IPVS; see proxier_vm_test.go for the tests in the VM.)
func ExampleProxier_Apply() {
	p, err := ipvs.New(ipvs.Options{
		Scheduler:    "rr",
		GracePeriod:  30 * time.Second,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
	})
	if err != nil {
		log.Print(err) // e.g. ipvs.ErrNoIPVS
		return
	}
	defer p.Close()
	plan := &datapath.Plan{Full: true, Frontends: []datapath.Frontend{{
		Service: datapath.ServicePortName{Namespace: "default", Name: "web", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP,
		Addr: netip.MustParseAddr("10.96.0.10"), Family: datapath.IPv4, Port: 80,
		Endpoints: []datapath.Endpoint{
			{Addr: netip.MustParseAddrPort("10.244.1.5:8080"), Weight: 3},
			{Addr: netip.MustParseAddrPort("10.244.2.7:8080"), Weight: 1},
		},
	}}}
	if err := p.Apply(context.Background(), plan); err != nil {
		log.Print(err)
	}
	log.Printf("%+v", p.LastStats()) // the kernel now has 10.96.0.10:80 wrr with weights 3 and 1
}
