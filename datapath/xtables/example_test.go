package xtables_test

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// A transaction of typed rules, applied to a Fake, and a packet traced
// through it.
func ExampleFake_Trace() {
	svc := xtables.Chain{Table: xtables.NAT, Name: "EP-SVC-EXAMPLE"}
	tx := xtables.NewTransaction[string](xtables.NAT)
	tx.Declare("web", svc)
	tx.Add("web", svc, &xtables.Rule{
		Matches: []xtables.Match{xtables.Proto("tcp"), xtables.Probability(0.5)},
		Target:  xtables.DNAT(netip.MustParseAddrPort("10.244.0.2:8080")),
	})
	tx.Add("web", svc, &xtables.Rule{
		Matches: []xtables.Match{xtables.Proto("tcp")},
		Target:  xtables.DNAT(netip.MustParseAddrPort("10.244.0.3:8080")),
	})
	tx.Insert(xtables.Chain{Table: xtables.NAT, Name: "PREROUTING"}, &xtables.Rule{
		Matches: []xtables.Match{xtables.DstHost(netip.MustParseAddr("10.96.0.10")), xtables.DPort("tcp", 80)},
		Comment: "web cluster IP",
		Target:  xtables.JumpTo(svc.Name),
	})
	text, _, err := tx.Render()
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Print(string(text))

	k := xtables.NewFake()
	if err := k.RestoreNoFlush(context.Background(), text); err != nil {
		fmt.Println(err)
		return
	}
	paths, err := k.Trace(xtables.Packet{
		Src: netip.MustParseAddr("10.244.1.5"), Dst: netip.MustParseAddr("10.96.0.10"), Proto: "tcp", Port: 80,
	}, []netip.Addr{netip.MustParseAddr("192.168.1.10")})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, p := range paths {
		fmt.Println(p.Verdict, p.To, p.Probability, p.Masquerade)
	}
	// Output:
	// *nat
	// :EP-SVC-EXAMPLE - [0:0]
	// -A EP-SVC-EXAMPLE -p tcp -m statistic --mode random --probability 0.5000000000 -j DNAT --to-destination 10.244.0.2:8080
	// -A EP-SVC-EXAMPLE -p tcp -j DNAT --to-destination 10.244.0.3:8080
	// -I PREROUTING 1 -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -m comment --comment "web cluster IP" -j EP-SVC-EXAMPLE
	// COMMIT
	// ACCEPT 10.244.0.2:8080 0.5 false
	// ACCEPT 10.244.0.3:8080 0.5 false
}
