package ipset_test

import (
	"fmt"
	"net/netip"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/ipset"
)

func ExampleEntry_String() {
	e := ipset.Entry{
		Addr:     netip.MustParseAddr("203.0.113.7"),
		Protocol: datapath.TCP,
		Port:     443,
		Net:      netip.MustParsePrefix("198.51.100.0/24"),
	}
	fmt.Println(e)
	fmt.Println(ipset.Set{Name: "EP-LOAD-BALANCER-SRC", Type: ipset.HashIPPortNet, Family: datapath.IPv4})
	// Output:
	// 203.0.113.7,tcp:443,198.51.100.0/24
	// EP-LOAD-BALANCER-SRC (hash:ip,port,net inet)
}
