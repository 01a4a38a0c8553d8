package policy_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/policy"
	"github.com/edgeproxy/edgeproxy/policy/abi"
)

const hostileDir = "modules/testdata/hostile/"

func input(ns string, n int) *abi.Input {
	in := &abi.Input{
		Service: abi.Service{Namespace: ns, Name: "web", Protocol: "TCP", Port: 80},
		Node:    abi.Node{Name: "n1", Zone: "a"},
	}
	for i := range n {
		in.Endpoints = append(in.Endpoints, abi.Endpoint{
			Addr: netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)}), Port: 80, NodeName: "n1", Zone: "a",
			Ready: true, Serving: true, Weight: 1,
		})
	}
	return in
}

func failed(r *policy.Report) map[string]string {
	m := map[string]string{}
	for _, c := range r.Checks {
		if c.Status == policy.StatusFail {
			m[c.Name] = c.Detail
		}
	}
	return m
}

// TestHostileRefusedAtCheck: with their default config every hostile
// module misbehaves on every call, and the checks refuse each one, naming
// the check that caught it.
func TestHostileRefusedAtCheck(t *testing.T) {
	ctx := context.Background()
	h, _ := newHost(t, policy.Compiler, func(o *policy.Options) { o.ProbeTimeout = 200 * time.Millisecond })
	cases := []struct {
		module, pin, check, detail string
	}{
		{"loop", "", "probe:empty", "timeout"},
		{"memory", "", "probe:empty", ""}, // a trap, or a timeout while the guest GC thrashes
		{"trap", "", "probe:empty", "trap"},
		{"wronglen", "", "probe:empty", "1 weights for 0 endpoints"},
		{"range", "", "probe:one", "above the maximum"},
		{"nondeterministic", "", "deterministic", "different output"},
		{"forbidden", "", "imports", "wasi_snapshot_preview1.path_open is not allowed"},
		{"noexport", "", "exports", "missing export ep_evaluate"},
		{"badsig", "", "exports", "signature (i32) -> (i32), want (i32, i32) -> (i64)"},
		{"topology", strings.Repeat("0", 64), "sha256", "does not match the pinned"},
	}
	for _, c := range cases {
		t.Run(c.module, func(t *testing.T) {
			dir := hostileDir + c.module
			if c.module == "topology" {
				dir = "modules/topology" // a good module, pinned to the wrong hash
			}
			wasm := build(t, dir)
			r := h.Check(ctx, policy.Spec{Name: c.module, Wasm: wasm, SHA256: c.pin})
			if r.OK() {
				t.Fatalf("module passed every check:\n%s", r)
			}
			f := failed(r)
			if !strings.Contains(f[c.check], c.detail) {
				t.Fatalf("check %s: got %q, want it to contain %q\n%s", c.check, f[c.check], c.detail, r)
			}
			if len(r.Checks) < 13 {
				t.Errorf("report lists %d checks, want every check listed:\n%s", len(r.Checks), r)
			}
			if !strings.Contains(r.String(), "REFUSED") {
				t.Errorf("report does not say REFUSED:\n%s", r)
			}
			if _, _, err := h.Load(ctx, policy.Spec{Name: c.module, Wasm: wasm, SHA256: c.pin}); err == nil {
				t.Fatal("Load accepted a module that failed its checks")
			}
		})
	}
	t.Run("zero", func(t *testing.T) {
		// Dropping every endpoint is a chain's decision (allowEmpty), not a
		// property of the module: it passes the checks and is contained at
		// run time (TestHostileContainedAtRunTime).
		r := h.Check(ctx, policy.Spec{Name: "zero", Wasm: build(t, hostileDir+"zero")})
		if !r.OK() {
			t.Fatalf("zero refused at check time:\n%s", r)
		}
	})
}

// TestHostileContainedAtRunTime: configured to misbehave only for one
// namespace, each hostile module passes its checks; at run time the
// failure is caught and classified, the instance is discarded and
// re-created with backoff, and other services keep being served.
func TestHostileContainedAtRunTime(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		module  string
		reason  policy.Reason
		discard bool // trap/timeout: instance discarded, backoff applies
		engines []string
	}{
		{"loop", policy.ReasonTimeout, true, engines},
		{"memory", policy.ReasonTrap, true, engines}, // or a timeout: see below
		{"trap", policy.ReasonTrap, true, engines},
		{"wronglen", policy.ReasonInvalid, false, engines[:1]},
		{"range", policy.ReasonInvalid, false, engines[:1]},
		{"zero", policy.ReasonInvalid, false, engines[:1]},
	}
	for _, c := range cases {
		for _, engine := range c.engines {
			t.Run(c.module+"/"+engine, func(t *testing.T) {
				clk := &clock{t: time.Unix(1e9, 0)}
				h, logs := newHost(t, engine, func(o *policy.Options) {
					// The deadline only has to fire for the loop; for the
					// others it must not fire first, even under -race on a
					// loaded machine (a Go guest's panic path is long under
					// the interpreter), or the failure is misclassified.
					o.Timeout = 100 * time.Millisecond
					if engine == policy.Interpreter {
						o.Timeout = 500 * time.Millisecond
					}
					if c.module != "loop" {
						o.Timeout = 10 * time.Second
					}
					o.Now = clk.Now
				})
				inst, rep, err := h.Load(ctx, policy.Spec{Name: c.module, Wasm: build(t, hostileDir+c.module), Config: []byte(`{"only":"hostile"}`)})
				if err != nil {
					t.Fatalf("load: %v\n%s", err, rep)
				}
				defer inst.Close(ctx)
				good := input("default", 3)
				if _, err := inst.Evaluate(ctx, good); err != nil {
					t.Fatalf("good input: %v", err)
				}
				_, err = inst.Evaluate(ctx, input("hostile", 3))
				got := policy.ReasonOf(err)
				if c.module == "memory" && got == policy.ReasonTimeout {
					got = policy.ReasonTrap // the guest GC may run out the deadline before memory.grow fails
				}
				if got != c.reason {
					t.Fatalf("hostile input: reason %q (%v), want %q", got, err, c.reason)
				}
				if c.module == "memory" && inst.State().MemoryBytes > 16<<20 {
					t.Errorf("memory %d above the 16 MiB cap", inst.State().MemoryBytes)
				}
				other := input("default", 4)
				if c.discard {
					if inst.State().Instantiated {
						t.Fatal("instance kept after a trap or timeout")
					}
					// A second failure in a row: the instance is re-created
					// at once, fails again, and now backs off.
					if _, err := inst.Evaluate(ctx, input("hostile", 5)); policy.ReasonOf(err) == "" {
						t.Fatal("second hostile call succeeded")
					}
					if _, err := inst.Evaluate(ctx, other); policy.ReasonOf(err) != policy.ReasonCircuitOpen || !errors.Is(err, policy.ErrCircuitOpen) {
						t.Fatalf("call during backoff: %v, want circuit_open (state %+v)", err, inst.State())
					}
					clk.Add(time.Second)
				}
				res, err := inst.Evaluate(ctx, other)
				if err != nil {
					t.Fatalf("other service after the failure: %v", err)
				}
				if len(res.Output.Weights) != 4 {
					t.Fatalf("weights %v", res.Output.Weights)
				}
				_ = logs
			})
		}
	}
}

// TestNondeterministicContained: a module whose output changes between
// calls cannot flap a service, because an unchanged input is answered from
// the cache.
func TestNondeterministicContained(t *testing.T) {
	ctx := context.Background()
	h, _ := newHost(t, policy.Compiler, nil)
	inst, rep, err := h.Load(ctx, policy.Spec{Name: "nd", Wasm: build(t, hostileDir+"nondeterministic"), Config: []byte(`{"only":"hostile"}`)})
	if err != nil {
		t.Fatalf("load: %v\n%s", err, rep)
	}
	defer inst.Close(ctx)
	in := input("hostile", 3)
	first, err := inst.Evaluate(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		again, err := inst.Evaluate(ctx, in)
		if err != nil || !again.Cached || !slicesEqual(again.Output.Weights, first.Output.Weights) {
			t.Fatalf("repeat: %v cached=%v err=%v, want %v from the cache", again.Output.Weights, again.Cached, err, first.Output.Weights)
		}
	}
}

// TestCircuitBreaker: Threshold consecutive failures open the circuit; the
// module is not called while it is open; when it closes one call goes
// through, and a success resets it.
func TestCircuitBreaker(t *testing.T) {
	ctx := context.Background()
	clk := &clock{t: time.Unix(1e9, 0)}
	h, _ := newHost(t, policy.Compiler, func(o *policy.Options) {
		o.Now = clk.Now
		o.Breaker = policy.Breaker{Threshold: 3, OpenFor: time.Minute}
	})
	inst, _, err := h.Load(ctx, policy.Spec{Name: "range", Wasm: build(t, hostileDir+"range"), Config: []byte(`{"only":"hostile"}`)})
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(ctx)
	for i := range 3 {
		if _, err := inst.Evaluate(ctx, input("hostile", i+1)); policy.ReasonOf(err) != policy.ReasonInvalid {
			t.Fatalf("call %d: %v, want invalid", i, err)
		}
	}
	if _, err := inst.Evaluate(ctx, input("default", 2)); policy.ReasonOf(err) != policy.ReasonCircuitOpen {
		t.Fatalf("after 3 failures: %v, want circuit_open", err)
	}
	clk.Add(time.Minute)
	if _, err := inst.Evaluate(ctx, input("default", 2)); err != nil {
		t.Fatalf("half-open call: %v", err)
	}
	if s := inst.State(); s.Failures != 0 {
		t.Fatalf("failures %d after a success", s.Failures)
	}
}

func slicesEqual(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
