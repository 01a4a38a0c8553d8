package policy_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/modules/modbuild"
	"github.com/edgeproxy/edgeproxy/policy"
	"github.com/edgeproxy/edgeproxy/policy/abi"
)

// TestConformance runs every module in modules/ through the host on both
// engines: every check passes, every golden input gets a valid output, and
// both engines agree byte for byte.
func TestConformance(t *testing.T) {
	root, err := modbuild.Root()
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := modbuild.Examples(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 3 {
		t.Fatalf("found %d example modules (%v), want at least topology, weighted, scheduler", len(dirs), dirs)
	}
	ctx := context.Background()
	for _, dir := range dirs {
		wasm := build(t, dir)
		outputs := map[string][][]byte{}
		for _, engine := range engines {
			t.Run(dir+"/"+engine, func(t *testing.T) {
				// Behaviour, not speed: a generous deadline for the interpreter.
				h, _ := newHost(t, engine, func(o *policy.Options) { o.Timeout = 200 * time.Millisecond })
				inst, rep, err := h.Load(ctx, policy.Spec{Name: dir, Wasm: wasm})
				if err != nil {
					t.Fatalf("load: %v\n%s", err, rep)
				}
				defer inst.Close(ctx)
				for _, c := range rep.Checks {
					if c.Status == policy.StatusFail {
						t.Errorf("check %s failed: %s", c.Name, c.Detail)
					}
				}
				for _, p := range policy.ProbeInputs() {
					res, err := inst.Evaluate(ctx, &p.Input)
					if err != nil {
						t.Fatalf("%s: %v", p.Name, err)
					}
					if err := res.Output.Validate(len(p.Input.Endpoints)); err != nil {
						t.Fatalf("%s: %v", p.Name, err)
					}
					outputs[engine] = append(outputs[engine], abi.AppendOutput(nil, &res.Output))
					again, err := inst.Evaluate(ctx, &p.Input)
					if err != nil || !again.Cached {
						t.Fatalf("%s: second evaluation: cached=%v err=%v", p.Name, again.Cached, err)
					}
				}
			})
		}
		if !slices.EqualFunc(outputs[policy.Compiler], outputs[policy.Interpreter], slices.Equal) {
			t.Errorf("%s: compiler and interpreter disagree", dir)
		}
	}
}
