package sdk_test

import (
	"fmt"
	"net/netip"

	"github.com/edgeproxy/edgeproxy/modules/sdk"
)

// A module that keeps only endpoints in this node's zone, run on the build
// machine through sdk.Call as the host would run it.
func Example() {
	sdk.Run(sdk.Module{Evaluate: func(in *sdk.Input, out *sdk.Output) error {
		for i, e := range in.Endpoints {
			if e.Zone != in.Node.Zone {
				out.Weights[i] = 0
			}
		}
		out.Reason = "same zone"
		return nil
	}})
	out, err := sdk.Call([]byte("{}"), &sdk.Input{
		Node: sdk.Node{Name: "n1", Zone: "a"},
		Endpoints: []sdk.Endpoint{
			{Addr: netip.MustParseAddr("10.0.0.1"), Zone: "a", Weight: 1},
			{Addr: netip.MustParseAddr("10.0.0.2"), Zone: "b", Weight: 1},
		},
	})
	fmt.Println(out.Weights, out.Reason, err)
	// Output: [1 0] same zone <nil>
}
