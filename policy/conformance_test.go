package policy_test

import (
	"bytes"
	"context"
	"fmt"
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
	if len(dirs) < 5 {
		t.Fatalf("found %d example modules (%v), want at least topology, weighted, scheduler, rust/topology, c/zoneweight.c", len(dirs), dirs)
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

// TestRustTopologyMatchesGo: the Rust topology module answers every input
// byte for byte as the Go one does — golden inputs and more, under several
// configs, on both engines, one call at a time and batched — and refuses
// the configs the Go one refuses.
func TestRustTopologyMatchesGo(t *testing.T) {
	ctx := context.Background()
	goWasm, rustWasm := build(t, "modules/topology"), build(t, "modules/rust/topology")
	var ins []*abi.Input
	for _, p := range policy.ProbeInputs() {
		ins = append(ins, &p.Input)
	}
	for k, n := range []int{1, 3, 10, 40} {
		in := benchInput(n)
		switch k {
		case 1:
			in.Node.Region = "" // the node's region from the regions map, if any
		case 2:
			in.Node.Zone, in.Endpoints[0].Zone = "", ""
		case 3:
			in.Endpoints[5].Local = true
		}
		ins = append(ins, in)
	}
	configs := []string{`{}`, `{"minEndpoints":2}`, `{"MinEndpoints":100}`, `{"levels":["zone","any"]}`, `{"levels":["region"]}`,
		`{"regions":{"zone-b":"eu","zone-c":"region-1","zone-a":"x","zone-a":"region-1"},"minEndpoints":3}`}
	for _, engine := range engines {
		// Behaviour, not speed: a deadline no loaded machine (or -race) misses.
		h, _ := newHost(t, engine, func(o *policy.Options) { o.Timeout = 2 * time.Second; o.BatchSize = 4 })
		for _, cfg := range configs {
			var outs [2][][]byte
			for m, wasm := range [][]byte{goWasm, rustWasm} {
				inst, rep, err := h.Load(ctx, policy.Spec{Name: fmt.Sprint("topology-", m), Wasm: wasm, Config: []byte(cfg), AllowEmpty: true})
				if err != nil {
					t.Fatalf("%s %s: load: %v\n%s", engine, cfg, err, rep)
				}
				for k, in := range ins {
					res, err := inst.Evaluate(ctx, in)
					if err != nil {
						t.Fatalf("%s %s: input %d: %v", engine, cfg, k, err)
					}
					outs[m] = append(outs[m], abi.AppendOutput(nil, &res.Output))
				}
				inst.Close(ctx)
				// Batched, on a fresh instance (no cache).
				inst, _, err = h.Load(ctx, policy.Spec{Name: fmt.Sprint("topology-", m), Wasm: wasm, Config: []byte(cfg), AllowEmpty: true})
				if err != nil {
					t.Fatal(err)
				}
				for k, r := range inst.EvaluateBatch(ctx, ins) {
					if r.Err != nil || !bytes.Equal(abi.AppendOutput(nil, &r.Output), outs[m][k]) {
						t.Errorf("%s %s module %d input %d: batched %+v %v differs from one call", engine, cfg, m, k, r.Output, r.Err)
					}
				}
				inst.Close(ctx)
			}
			for k := range ins {
				if !bytes.Equal(outs[0][k], outs[1][k]) {
					var g, r abi.Output
					abi.DecodeOutput(outs[0][k], &g)
					abi.DecodeOutput(outs[1][k], &r)
					t.Errorf("%s %s input %d: Go %+v, Rust %+v", engine, cfg, k, g, r)
				}
			}
		}
		for _, bad := range []string{`{"levels":["planet"]}`, `{"minEndpoints":"2"}`, `[]`, `{"regions":{"a":1}}`} {
			for m, wasm := range [][]byte{goWasm, rustWasm} {
				if _, _, err := h.Load(ctx, policy.Spec{Name: "bad", Wasm: wasm, Config: []byte(bad)}); err == nil {
					t.Errorf("%s: module %d accepted config %s", engine, m, bad)
				}
			}
		}
	}
}

// TestCZoneWeight: the C example (ABI 1.0, no batch export) weighs
// endpoints in the node's zone four times, and a batch reaches it one call
// per input.
func TestCZoneWeight(t *testing.T) {
	ctx := context.Background()
	h, _ := newHost(t, policy.Compiler, func(o *policy.Options) { o.Timeout = time.Second })
	inst, rep, err := h.Load(ctx, policy.Spec{Name: "zoneweight", Wasm: build(t, "modules/c/zoneweight.c")})
	if err != nil {
		t.Fatalf("load: %v\n%s", err, rep)
	}
	defer inst.Close(ctx)
	for _, c := range rep.Checks {
		if c.Name == "batch" && c.Status != policy.StatusSkip {
			t.Errorf("batch check %s: %s, want skip for an ABI 1.0 module", c.Status, c.Detail)
		}
	}
	mixed := policy.ProbeInputs()[3].Input // zone-a node; weights 1, 1, 7, MaxWeight, 1
	res := inst.EvaluateBatch(ctx, []*abi.Input{&mixed, benchInput(4)})
	want := [][]uint32{{4, 1, 28, abi.MaxWeight, 1}, {4, 1, 1, 4}}
	for k, r := range res {
		if r.Err != nil || !slices.Equal(r.Output.Weights, want[k]) || r.Output.Reason != "same zone x4" {
			t.Errorf("input %d: %v %q %v, want %v", k, r.Output.Weights, r.Output.Reason, r.Err, want[k])
		}
	}
}
