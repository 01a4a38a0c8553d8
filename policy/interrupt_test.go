package policy

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/sys"

	"github.com/edgeproxy/edgeproxy/modules/modbuild"
)

// spinWasm exports "spin", a function that never returns:
// (func (export "spin") (loop (br 0))). extraExport, when set, also
// exports it under that name.
func spinWasm(extraExport string) []byte {
	body := []byte{0, 0x03, 0x40, 0x0c, 0, 0x0b, 0x0b} // no locals; loop br 0 end; end
	return oneFunc([]byte{1, 0x60, 0, 0}, body, extraExport)
}

// forkWasm exports "spin" too, a call tree with no loop:
// f(n) = if n == 0 return; f(n-1); f(n-1). f(60) makes 2^60 calls.
func forkWasm() []byte {
	body := []byte{0,
		0x20, 0, 0x45, 0x04, 0x40, 0x0f, 0x0b, // local.get 0; i32.eqz; if return end
		0x20, 0, 0x41, 1, 0x6b, 0x10, 0, // f(n-1)
		0x20, 0, 0x41, 1, 0x6b, 0x10, 0, // f(n-1)
		0x0b}
	return oneFunc([]byte{1, 0x60, 1, 0x7f, 0}, body, "")
}

// oneFunc is a module of one type (its section body types), one function
// of it with the given body, exported as "spin" (and as extraExport).
func oneFunc(types, body []byte, extraExport string) []byte {
	b := []byte("\x00asm\x01\x00\x00\x00")
	b = appendSection(b, 1, types)
	b = appendSection(b, 3, []byte{1, 0})       // one function of type 0
	b = appendSection(b, 5, []byte{1, 0x00, 1}) // one memory of one page
	exports := []byte{1, 4, 's', 'p', 'i', 'n', 0, 0}
	if extraExport != "" {
		exports[0] = 2
		exports = append(appendU32(exports, uint32(len(extraExport))), extraExport...)
		exports = append(exports, 0, 0)
	}
	b = appendSection(b, 7, exports)
	return appendSection(b, 10, append([]byte{1, byte(len(body))}, body...))
}

// The check instrument inserts for a module with no globals of its own.
var checkGlobal0 = checkCode(0)

// TestInstrumentSpin: the check lands at the start of the function and
// right after the loop's block type,
// the module gains the global and its export, and wazero accepts it.
func TestInstrumentSpin(t *testing.T) {
	out, err := instrument(spinWasm(""))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(out, append([]byte{0x03, 0x40}, checkGlobal0...)) {
		t.Fatalf("no check after the loop header:\n% x", out)
	}
	if !bytes.Contains(out, append([]byte{0}, checkGlobal0...)) {
		t.Fatalf("no check at the function's start:\n% x", out)
	}
	if !bytes.Contains(out, []byte(interruptExport)) {
		t.Fatalf("no %s export:\n% x", interruptExport, out)
	}
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigCompiler())
	defer rt.Close(ctx)
	mod, err := rt.Instantiate(ctx, out)
	if err != nil {
		t.Fatalf("wazero refuses the rewritten module: %v", err)
	}
	g, ok := mod.ExportedGlobal(interruptExport).(api.MutableGlobal)
	if !ok || g.Type() != api.ValueTypeI32 || g.Get() != 0 {
		t.Fatalf("export %s: %v", interruptExport, g)
	}
}

// TestWatchdogStopsSpin: a guest that never returns (a loop, or a call
// tree without one) is stopped by the watchdog (the call traps) and the
// flag is clear again afterwards; a
// module the rewriter refuses (it exports the interrupt's name itself)
// runs under wazero's checks and is stopped by its context's deadline.
// A broken interrupt makes this test hang until go test's -timeout.
func TestWatchdogStopsSpin(t *testing.T) {
	ctx := context.Background()
	h, err := NewHost(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(ctx)
	if h.Engine() != Compiler {
		t.Skip("the compiler engine is not available here: the interpreter always runs with wazero's checks")
	}
	for name, wasm := range map[string][]byte{"loop": spinWasm(""), "calls": forkWasm()} {
		t.Run(name, func(t *testing.T) {
			c, err := h.compile(ctx, name, wasm)
			if err != nil || !c.interruptible {
				t.Fatalf("compile: %v, interruptible %v", err, c != nil && c.interruptible)
			}
			mod, err := c.rt.InstantiateModule(ctx, c.cm, wazero.NewModuleConfig().WithName(""))
			if err != nil {
				t.Fatal(err)
			}
			defer mod.Close(ctx)
			spin := mod.ExportedFunction("spin")
			args := make([]uint64, len(spin.Definition().ParamTypes()))
			for k := range args {
				args[k] = 60
			}
			flag := mod.ExportedGlobal(interruptExport).(api.MutableGlobal)
			w := newWatchdog(flag)
			for range 2 { // the second time shows the flag was cleared and the timer re-armed
				// Garbage collections meanwhile: their stop-the-world must
				// get the spinning goroutine to stop (the check's exits to
				// Go), or nothing, the timer included, runs again.
				done := make(chan struct{})
				gcs := make(chan int)
				go func() {
					n := 0
					for ; ; n++ {
						select {
						case <-done:
							gcs <- n
							return
						default:
							runtime.GC()
						}
					}
				}()
				w.arm(ctx, 20*time.Millisecond)
				_, err = spin.Call(ctx, args...)
				close(done)
				t.Logf("%d garbage collections during the spin", <-gcs)
				if st := w.disarm(); st != stopTimeout || err == nil {
					t.Fatalf("spin: err %v, stop %d, want a trap and stopTimeout", err, st)
				}
				if v := flag.Get(); v != 0 {
					t.Fatalf("interrupt flag %d after disarm", v)
				}
			}
			// A deadline of the caller's that comes first is reported as theirs.
			cctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
			defer cancel()
			w.arm(cctx, time.Hour)
			_, err = spin.Call(ctx, args...)
			if st := w.disarm(); st != stopCanceled || err == nil {
				t.Fatalf("spin under the caller's deadline: err %v, stop %d, want stopCanceled", err, st)
			}
		})
	}
	t.Run("fallback", func(t *testing.T) {
		c, err := h.compile(ctx, "spin-named", spinWasm(interruptExport))
		if err != nil || c.interruptible {
			t.Fatalf("compile: %v, interruptible %v, want wazero's checks", err, c != nil && c.interruptible)
		}
		mod, err := c.rt.InstantiateModule(ctx, c.cm, wazero.NewModuleConfig().WithName(""))
		if err != nil {
			t.Fatal(err)
		}
		defer mod.Close(ctx)
		cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		_, err = mod.ExportedFunction("spin").Call(cctx)
		var ee *sys.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != sys.ExitCodeDeadlineExceeded {
			t.Fatalf("spin: %v, want wazero's deadline exit", err)
		}
	})
}

// TestInstrumentRefuses: what the rewriter does not read exactly is left
// to wazero's checks.
func TestInstrumentRefuses(t *testing.T) {
	threads := spinWasm("")
	threads = threads[:len(threads)-11]       // without its code section
	body := []byte{0, 0xfe, 0x03, 0x00, 0x0b} // atomic.fence: threads are not enabled
	threads = appendSection(threads, 10, append([]byte{1, byte(len(body))}, body...))
	for name, wasm := range map[string][]byte{
		"exports the name":  spinWasm(interruptExport),
		"threads opcode":    threads,
		"not wasm":          []byte("\x00asm\x02\x00\x00\x00"),
		"no memory":         selfTestWasm,
		"truncated section": spinWasm("")[:20],
	} {
		if _, err := instrument(wasm); err == nil {
			t.Errorf("%s: instrumented", name)
		}
	}
}

// TestInstrumentExamples: every example module is rewritten (none falls
// back to wazero's slower checks), with one check per loop.
func TestInstrumentExamples(t *testing.T) {
	for _, dir := range []string{"modules/topology", "modules/rust/topology", "modules/c/zoneweight.c", "modules/testdata/hostile/loop"} {
		t.Run(dir, func(t *testing.T) {
			wasm := modbuild.Build(t, dir)
			out, err := instrument(wasm)
			if err != nil {
				t.Fatal(err)
			}
			if len(out) <= len(wasm) {
				t.Fatalf("%d bytes in, %d out: no check inserted", len(wasm), len(out))
			}
		})
	}
}

// FuzzInstrument: no input panics the rewriter, and whatever wazero
// accepts it still accepts rewritten.
func FuzzInstrument(f *testing.F) {
	f.Add(spinWasm(""))
	f.Add(spinWasm(interruptExport))
	f.Add(selfTestWasm)
	f.Add([]byte("\x00asm\x01\x00\x00\x00"))
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer rt.Close(ctx)
	f.Fuzz(func(t *testing.T, wasm []byte) {
		out, err := instrument(wasm)
		if err != nil {
			return
		}
		if _, err := rt.CompileModule(ctx, wasm); err != nil {
			return
		}
		if _, err := rt.CompileModule(ctx, out); err != nil {
			t.Fatalf("wazero accepts the module but not its rewrite: %v", err)
		}
	})
}

// BenchmarkInstrumentCompile is what the rewrite costs a cold compile of
// the Go topology module (no compilation cache): "rewrite" alone, the
// module compiled with wazero's checks ("checked", as before the rewrite)
// and rewritten then compiled without them ("rewritten").
func BenchmarkInstrumentCompile(b *testing.B) {
	ctx := context.Background()
	wasm := modbuild.Build(b, "modules/topology")
	b.Run("rewrite", func(b *testing.B) {
		for b.Loop() {
			if _, err := instrument(wasm); err != nil {
				b.Fatal(err)
			}
		}
	})
	compile := func(b *testing.B, checked bool) {
		for b.Loop() {
			rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigCompiler().WithCloseOnContextDone(checked))
			code := wasm
			if !checked {
				var err error
				if code, err = instrument(wasm); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := rt.CompileModule(ctx, code); err != nil {
				b.Fatal(err)
			}
			rt.Close(ctx)
		}
	}
	b.Run("checked", func(b *testing.B) { compile(b, true) })
	b.Run("rewritten", func(b *testing.B) { compile(b, false) })
}

// TestRewriteCached: with a CacheDir the rewrite is kept there and read
// back by the next host; a damaged file is rewritten, not trusted.
func TestRewriteCached(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	wasm := spinWasm("")
	want, err := instrument(wasm)
	if err != nil {
		t.Fatal(err)
	}
	const sum = "0123"
	path := filepath.Join(dir, rewriteVersion+sum+".wasm")
	for i, damage := range []bool{false, false, true} {
		if damage {
			if err := os.WriteFile(path, []byte("\x00asm\x01\x00\x00\x00garbage"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		h, err := NewHost(ctx, Options{CacheDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		if h.Engine() != Compiler {
			h.Close(ctx)
			t.Skip("the compiler engine is not available here: nothing is rewritten")
		}
		c, err := h.compile(ctx, sum, wasm)
		if err != nil || !c.interruptible {
			t.Fatalf("load %d: %v, interruptible %v", i, err, c != nil && c.interruptible)
		}
		h.Close(ctx)
		if got, err := os.ReadFile(path); damage && err == nil && !bytes.Equal(got, want) {
			t.Fatalf("load %d: the damaged file is still there", i)
		} else if !damage && !bytes.Equal(got, want) {
			t.Fatalf("load %d: cached rewrite %q, err %v", i, got, err)
		}
	}
}
