package policy_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/policy"
	"github.com/edgeproxy/edgeproxy/policy/abi"
)

// TestEvaluateBatchMatchesOneByOne: a batch gives each input the output
// one call per input gives, in order, across several batches (BatchSize 3),
// with equal inputs and inputs already in the cache mixed in.
func TestEvaluateBatchMatchesOneByOne(t *testing.T) {
	ctx := context.Background()
	h, _ := newHost(t, policy.Compiler, func(o *policy.Options) { o.Timeout = time.Second; o.BatchSize = 3 })
	wasm := build(t, "modules/topology")
	one, _, err := h.Load(ctx, policy.Spec{Name: "one", Wasm: wasm})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close(ctx)
	batched, _, err := h.Load(ctx, policy.Spec{Name: "batched", Wasm: wasm})
	if err != nil {
		t.Fatal(err)
	}
	defer batched.Close(ctx)
	var ins []*abi.Input
	for k := range 8 {
		in := benchInput(1 + k%5)
		in.Node.Zone = []string{"zone-a", "zone-b", "zone-x"}[k%3]
		ins = append(ins, in)
	}
	ins = append(ins, ins[2], ins[5])                        // equal inputs in the same call
	if _, err := batched.Evaluate(ctx, ins[0]); err != nil { // one from the cache
		t.Fatal(err)
	}
	res := batched.EvaluateBatch(ctx, ins)
	if len(res) != len(ins) {
		t.Fatalf("%d results for %d inputs", len(res), len(ins))
	}
	for k, in := range ins {
		want, err := one.Evaluate(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		if res[k].Err != nil {
			t.Fatalf("input %d: %v", k, res[k].Err)
		}
		if got, w := abi.AppendOutput(nil, &res[k].Output), abi.AppendOutput(nil, &want.Output); !bytes.Equal(got, w) {
			t.Errorf("input %d: batch %+v, one by one %+v", k, res[k].Output, want.Output)
		}
		if res[k].Cached != (k == 0) {
			t.Errorf("input %d: cached=%v", k, res[k].Cached)
		}
	}
	// The results are the caller's: changing one changes no other.
	res[2].Output.Weights[0] = 9
	if res[8].Output.Weights[0] == 9 {
		t.Error("equal inputs share their weights")
	}
}

// TestHostileInBatch: in a batch, one hostile input — a bad output (too
// many weights, a weight out of range, all zero), a loop, a trap, a memory
// bomb — fails only that input; its batch-mates get their answers, and
// the module keeps serving afterwards.
func TestHostileInBatch(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		module string
		reason policy.Reason
	}{
		{"wronglen", policy.ReasonInvalid},
		{"range", policy.ReasonInvalid},
		{"zero", policy.ReasonInvalid},
		{"loop", policy.ReasonTimeout},
		{"trap", policy.ReasonTrap},
		{"memory", policy.ReasonTrap},
	}
	for _, c := range cases {
		t.Run(c.module, func(t *testing.T) {
			clk := &clock{t: time.Unix(1e9, 0)}
			h, logs := newHost(t, policy.Compiler, func(o *policy.Options) {
				o.Timeout = 10 * time.Second // as in TestHostileContainedAtRunTime
				if c.module == "loop" {
					o.Timeout = 100 * time.Millisecond
				}
				o.Now = clk.Now
			})
			inst, rep, err := h.Load(ctx, policy.Spec{Name: c.module, Wasm: build(t, hostileDir+c.module), Config: []byte(`{"only":"hostile"}`)})
			if err != nil {
				t.Fatalf("load: %v\n%s", err, rep)
			}
			defer inst.Close(ctx)
			ins := []*abi.Input{input("default", 3), input("a", 2), input("hostile", 3), input("b", 4), input("c", 1)}
			res := inst.EvaluateBatch(ctx, ins)
			for k, r := range res {
				if k == 2 {
					got := policy.ReasonOf(r.Err)
					if c.module == "memory" && got == policy.ReasonTimeout {
						got = policy.ReasonTrap // as in TestHostileContainedAtRunTime
					}
					if got != c.reason {
						t.Fatalf("hostile input: %v, want %s", r.Err, c.reason)
					}
					continue
				}
				if r.Err != nil || len(r.Output.Weights) != len(ins[k].Endpoints) {
					t.Fatalf("input %d (%s): %v %v: a batch-mate of the hostile input failed", k, ins[k].Service.Namespace, r.Output.Weights, r.Err)
				}
			}
			if c.module == "loop" || c.module == "trap" || c.module == "memory" {
				if !bytes.Contains([]byte(logs.String()), []byte("evaluating its inputs one by one")) {
					t.Errorf("the batch call did not fail as a whole:\n%s", logs)
				}
			}
			if s := inst.State(); s.Failures > 1 {
				t.Errorf("state %+v: the batch-mates' successes did not reset the breaker", s)
			}
			again := inst.EvaluateBatch(ctx, []*abi.Input{input("d", 2), input("e", 3)})
			for k, r := range again {
				if r.Err != nil {
					t.Fatalf("after the failure, input %d: %v", k, r.Err)
				}
			}
		})
	}
}
