package policy_test

import (
	"context"
	"errors"
	"testing"

	"github.com/edgeproxy/edgeproxy/policy"
	"github.com/edgeproxy/edgeproxy/policy/abi"
)

// TestEvaluateAfterHostClose: closing the Host frees every guest memory
// (unmapped, on Linux); an instance still held then fails its calls
// cleanly instead of touching freed memory.
func TestEvaluateAfterHostClose(t *testing.T) {
	ctx := context.Background()
	h, err := policy.NewHost(ctx, policy.Options{CacheDir: cacheDir})
	if err != nil {
		t.Fatal(err)
	}
	inst, rep, err := h.Load(ctx, policy.Spec{Name: "topology", Wasm: build(t, "modules/topology")})
	if err != nil {
		t.Fatalf("%v\n%s", err, rep)
	}
	if _, err := inst.Evaluate(ctx, benchInput(10)); err != nil {
		t.Fatal(err)
	}
	h.Close(ctx)
	in := benchInput(10)
	in.Service.Port++ // not cached
	_, err = inst.Evaluate(ctx, in)
	var ce *policy.CallError
	if !errors.As(err, &ce) {
		t.Fatalf("evaluate after Host.Close: %v, want a CallError", err)
	}
	if res := inst.EvaluateBatch(ctx, []*abi.Input{in, benchInput(3)}); res[0].Err == nil || res[1].Err == nil {
		t.Fatalf("batch after Host.Close: %+v", res)
	}
	inst.Close(ctx)
}
