package policy_test

import (
	"context"
	"fmt"
	"os"

	"github.com/edgeproxy/edgeproxy/policy"
	"github.com/edgeproxy/edgeproxy/policy/abi"
)

// Check a module file, load it, and evaluate one service port. (Not run:
// it needs a built module; see TestConformance.)
func Example() {
	ctx := context.Background()
	h, err := policy.NewHost(ctx, policy.Options{CacheDir: "/var/lib/edgeproxy/wasm-cache"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer h.Close(ctx)
	wasm, err := os.ReadFile("topology.wasm")
	if err != nil {
		fmt.Println(err)
		return
	}
	inst, report, err := h.Load(ctx, policy.Spec{Name: "topology", Wasm: wasm, Config: []byte(`{"minEndpoints":2}`)})
	fmt.Print(report) // every check and its result
	if err != nil {
		return
	}
	defer inst.Close(ctx)
	res, err := inst.Evaluate(ctx, &policy.ProbeInputs()[2].Input)
	if reason := policy.ReasonOf(err); reason != "" {
		fmt.Println("failed:", reason) // trap | timeout | invalid | circuit_open
		return
	}
	fmt.Println(res.Output.Weights, res.Output.Reason, abi.MaxWeight)
}
