package policy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/edgeproxy/edgeproxy/policy"
	"github.com/edgeproxy/edgeproxy/policy/abi"
)

// benchInput is a 10-endpoint service port over three zones.
func benchInput(n int) *abi.Input {
	in := &abi.Input{
		Service: abi.Service{Namespace: "shop", Name: "web", PortName: "http", Protocol: "TCP", Port: 80,
			Annotations: []abi.KV{{Key: "edgeproxy.io/weights", Value: "zone:zone-a=80"}}},
		Node: abi.Node{Name: "edge-1", Zone: "zone-a", Region: "eu"},
	}
	for i := range n {
		in.Endpoints = append(in.Endpoints, abi.Endpoint{
			Addr: netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), Port: 8080,
			NodeName: fmt.Sprintf("edge-%d", i), Zone: []string{"zone-a", "zone-b", "zone-c"}[i%3],
			Ready: true, Serving: true, HintZones: []string{"zone-a"}, Weight: 1,
		})
	}
	return in
}

// BenchmarkEvaluateTopology10 is one evaluation of the topology module,
// in Go and in Rust, on a 10-endpoint service port: encode, copy in, call,
// copy out, decode, validate. The input changes every iteration so the
// result cache never answers. "batch64" evaluates 64 inputs per
// EvaluateBatch (one ep_evaluate_batch call) and reports per input.
// Reports the median as p50-ns (per call; per input for batch64).
func BenchmarkEvaluateTopology10(b *testing.B) {
	for _, m := range []struct{ lang, dir string }{{"go", "modules/topology"}, {"rust", "modules/rust/topology"}} {
		for _, engine := range engines {
			b.Run(m.lang+"/"+engine, func(b *testing.B) { benchEvaluate(b, m.dir, engine, 1) })
		}
		b.Run(m.lang+"/batch64", func(b *testing.B) { benchEvaluate(b, m.dir, policy.Compiler, 64) })
	}
}

// BenchmarkEvaluateC10 is BenchmarkEvaluateTopology10 for the C example
// (zoneweight: a different decision, the same input), for the per-call
// cost of a module with no language runtime at all.
func BenchmarkEvaluateC10(b *testing.B) {
	b.Run("compiler", func(b *testing.B) { benchEvaluate(b, "modules/c/zoneweight.c", policy.Compiler, 1) })
}

func benchEvaluate(b *testing.B, dir, engine string, batch int) {
	ctx := context.Background()
	h, _ := newHost(b, engine, func(o *policy.Options) { o.Timeout = time.Second })
	inst, _, err := h.Load(ctx, policy.Spec{Name: "m", Wasm: build(b, dir)})
	if err != nil {
		b.Fatal(err)
	}
	defer inst.Close(ctx)
	ins := make([]*abi.Input, batch)
	for k := range ins {
		ins[k] = benchInput(10)
	}
	times := make([]time.Duration, 0, b.N)
	cpu0 := cpuTime()
	b.ResetTimer()
	port := 0
	for b.Loop() {
		for _, in := range ins {
			port++
			in.Service.Port = uint16(1 + port%60000) // defeat the cache
		}
		start := time.Now()
		if batch == 1 {
			res, err := inst.Evaluate(ctx, ins[0])
			if err != nil || res.Cached {
				b.Fatal(err, res.Cached)
			}
		} else {
			for _, r := range inst.EvaluateBatch(ctx, ins) {
				if r.Err != nil || r.Cached {
					b.Fatal(r.Err, r.Cached)
				}
			}
		}
		times = append(times, time.Since(start)/time.Duration(batch))
	}
	n := float64(len(times) * batch)
	b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/n, "cpu-ns/input")
	b.ReportMetric(b.Elapsed().Seconds()*1e9/n, "ns/input")
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Nanoseconds()), "p50-ns")
}

// cpuTime is the process's user+system CPU time: on a machine shared with
// other work, wall-clock ns/op measures the contention as much as the code.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkEvaluateCached is the same call answered from the cache (an
// unchanged service port on a resync).
func BenchmarkEvaluateCached(b *testing.B) {
	ctx := context.Background()
	h, _ := newHost(b, policy.Compiler, nil)
	inst, _, err := h.Load(ctx, policy.Spec{Name: "topology", Wasm: build(b, "modules/topology")})
	if err != nil {
		b.Fatal(err)
	}
	defer inst.Close(ctx)
	in := benchInput(10)
	if _, err := inst.Evaluate(ctx, in); err != nil { // fills the cache
		b.Fatal(err)
	}
	for b.Loop() {
		if res, err := inst.Evaluate(ctx, in); err != nil || !res.Cached {
			b.Fatal(err, res.Cached)
		}
	}
}

// BenchmarkCompile measures compiling the topology module: cold (empty
// on-disk cache), warm (the on-disk cache from a previous process: a new
// runtime over the same directory), and with the interpreter.
func BenchmarkCompile(b *testing.B) {
	ctx := context.Background()
	wasm := build(b, "modules/topology")
	compile := func(b *testing.B, cfg wazero.RuntimeConfig) {
		rt := wazero.NewRuntimeWithConfig(ctx, cfg)
		defer rt.Close(ctx)
		if _, err := rt.CompileModule(ctx, wasm); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("compiler-cold", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			dir := b.TempDir()
			cache, err := wazero.NewCompilationCacheWithDir(dir)
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			compile(b, wazero.NewRuntimeConfigCompiler().WithCompilationCache(cache))
			cache.Close(ctx)
		}
	})
	b.Run("compiler-warm", func(b *testing.B) {
		dir := filepath.Join(b.TempDir(), "warm")
		cache, _ := wazero.NewCompilationCacheWithDir(dir)
		compile(b, wazero.NewRuntimeConfigCompiler().WithCompilationCache(cache))
		cache.Close(ctx)
		for b.Loop() {
			cache, err := wazero.NewCompilationCacheWithDir(dir) // fresh in-memory level
			if err != nil {
				b.Fatal(err)
			}
			compile(b, wazero.NewRuntimeConfigCompiler().WithCompilationCache(cache))
			cache.Close(ctx)
		}
	})
	b.Run("interpreter", func(b *testing.B) {
		for b.Loop() {
			compile(b, wazero.NewRuntimeConfigInterpreter())
		}
	})
}

// BenchmarkInstanceMemory instantiates the topology module 20 times and
// reports the guest's linear memory and the host heap per instance, after
// one evaluation each.
func BenchmarkInstanceMemory(b *testing.B) {
	ctx := context.Background()
	h, _ := newHost(b, policy.Compiler, func(o *policy.Options) { o.Timeout = time.Second })
	wasm := build(b, "modules/topology")
	const n = 20
	for b.Loop() {
		var insts []*policy.Instance
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		var linear uint64
		for i := range n {
			inst, _, err := h.Load(ctx, policy.Spec{Name: fmt.Sprint("t", i), Wasm: wasm})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := inst.Evaluate(ctx, benchInput(10)); err != nil {
				b.Fatal(err)
			}
			linear += uint64(inst.State().MemoryBytes)
			insts = append(insts, inst)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(linear)/n/(1<<20), "linear-MiB/instance")
		b.ReportMetric(float64(after.Sys-before.Sys)/n/(1<<20), "host-sys-MiB/instance")
		b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/n/(1<<10), "host-heap-KiB/instance")
		for _, inst := range insts {
			inst.Close(ctx)
		}
	}
}

// BenchmarkGuestDecode decodes a 10-endpoint input inside the guest, in
// the ABI's binary encoding and as JSON (RATIONALE.md).
func BenchmarkGuestDecode(b *testing.B) {
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigCompiler())
	defer rt.Close(ctx)
	wasi_snapshot_preview1.MustInstantiate(ctx, rt)
	mod, err := rt.InstantiateWithConfig(ctx, build(b, "modules/testdata/bench/decode"), wazero.NewModuleConfig().WithStartFunctions())
	if err != nil {
		b.Fatal(err)
	}
	if _, err := mod.ExportedFunction("_initialize").Call(ctx); err != nil {
		b.Fatal(err)
	}
	in := benchInput(10)
	js, _ := json.Marshal(in)
	for _, c := range []struct {
		name  string
		data  []byte
		fn    string
		batch uint64 // decodes per call, to amortize the call
	}{
		{"binary", abi.AppendInput(nil, in), "decode_binary", 100},
		{"binary-aliasing", abi.AppendInput(nil, in), "decode_aliasing", 100},
		{"json", js, "decode_json", 5},
	} {
		b.Run(c.name, func(b *testing.B) {
			res, err := mod.ExportedFunction("alloc").Call(ctx, uint64(len(c.data)))
			if err != nil || !mod.Memory().Write(uint32(res[0]), c.data) {
				b.Fatal(err)
			}
			batch := c.batch
			for b.Loop() {
				res, err := mod.ExportedFunction(c.fn).Call(ctx, batch)
				if err != nil || int32(res[0]) != 10 {
					b.Fatal(err, res)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(batch), "ns/decode")
			b.ReportMetric(float64(len(c.data)), "input-bytes")
		})
	}
	b.Run("call-overhead", func(b *testing.B) {
		for b.Loop() {
			if _, err := mod.ExportedFunction("noop").Call(ctx, 1); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkLoadWarm is what start-up costs per module once the on-disk
// compilation cache is warm (a restart): a new host over the same cache
// directory, then Load — compile (read from the cache), instantiate, the
// probes and the batch check, and the instance that is kept.
// cpu-ns/op is the process's CPU per load, steadier than wall time on a
// shared machine.
func BenchmarkLoadWarm(b *testing.B) {
	ctx := context.Background()
	for _, m := range []struct{ lang, dir string }{{"go", "modules/topology"}, {"rust", "modules/rust/topology"}, {"c", "modules/c/zoneweight.c"}} {
		b.Run(m.lang, func(b *testing.B) {
			wasm := build(b, m.dir)
			dir := filepath.Join(b.TempDir(), "cache")
			load := func() {
				h, err := policy.NewHost(ctx, policy.Options{CacheDir: dir})
				if err != nil {
					b.Fatal(err)
				}
				inst, rep, err := h.Load(ctx, policy.Spec{Name: m.lang, Wasm: wasm})
				if err != nil {
					b.Fatal(err, rep)
				}
				inst.Close(ctx)
				h.Close(ctx)
			}
			load() // warms the cache
			cpu0 := cpuTime()
			for b.Loop() {
				load()
			}
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}
