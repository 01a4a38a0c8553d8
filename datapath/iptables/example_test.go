package iptables_test

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/iptables"
)

// Render shows the rules a plan becomes, without touching the kernel.
func ExampleRender() {
	frontends := []datapath.Frontend{{
		Service: datapath.ServicePortName{Namespace: "default", Name: "web", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP,
		Addr: netip.MustParseAddr("10.96.0.10"), Family: datapath.IPv4, Port: 80,
		Endpoints: []datapath.Endpoint{
			{Addr: netip.MustParseAddrPort("10.244.0.2:8080"), Weight: 3},
			{Addr: netip.MustParseAddrPort("10.244.0.3:8080"), Weight: 1},
		},
	}}
	rs := iptables.Render(iptables.Config{Family: datapath.IPv4, MasqueradeBit: 14}, frontends)
	text, err := rs.RestoreText()
	if err != nil {
		fmt.Println(err)
	}
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "-A EP-SVC-") {
			fmt.Println(l)
		}
	}
	// Output:
	// -A EP-SVC-C2ZVBRFWS3FTJNAH -p tcp -m statistic --mode random --probability 0.7500000000 -j DNAT --to-destination 10.244.0.2:8080
	// -A EP-SVC-C2ZVBRFWS3FTJNAH -p tcp -j DNAT --to-destination 10.244.0.3:8080
}
