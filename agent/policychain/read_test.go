package policychain_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/policychain"
)

// within runs fn and fails the test if it has not returned after a
// few minutes: a read that blocks would otherwise hang the test binary
// (the wait is long, not a measure: a loaded machine stretches a load).
func within[T any](t *testing.T, what string, fn func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- fn() }()
	select {
	case v := <-done:
		return v
	case <-time.After(5 * time.Minute):
		t.Fatalf("%s: still blocked after 5 minutes", what)
		panic("unreachable")
	}
}

// unreadable are module paths that are no regular file, each with the
// kind the refusal names. A FIFO with no writer blocks a plain open or
// read forever; /dev/zero never ends.
func unreadable(t *testing.T) map[string]string {
	t.Helper()
	fifo := filepath.Join(t.TempDir(), "module.wasm")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatalf("mkfifo: %v", err)
	}
	paths := map[string]string{fifo: "a named pipe", t.TempDir(): "a directory"}
	if _, err := os.Stat("/dev/zero"); err == nil {
		paths["/dev/zero"] = "a character device"
	}
	return paths
}

// TestModuleReadRefusesNonRegularFiles (issue 29 §1): a FIFO, /dev/zero
// or a directory as a module's path is refused at once with a message
// naming the path and why, as a chain step (the load fails), as a shadow
// on a reload (the shadow is left out, the reload goes on) and by
// `module check` (CheckFile).
func TestModuleReadRefusesNonRegularFiles(t *testing.T) {
	ctx := context.Background()
	weighted := modulePath(t, "modules/weighted")
	base := policyConfig(map[string]string{"weighted": weighted},
		config.Chain{Name: "c", Modules: []config.ChainStep{{Module: "weighted", Config: map[string]any{"default": 7}}}})
	e, _, _ := newEvaluator(t, base)
	for path, kind := range unreadable(t) {
		want := path + ": not a regular file (" + kind + ")"

		step := policyConfig(map[string]string{"m": path}, config.Chain{Name: "c", Modules: []config.ChainStep{{Module: "m"}}})
		err := within(t, "load "+path, func() error { return e.Reload(ctx, step) })
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("chain step %s: %v, want an error containing %q", path, err, want)
		}
		if v := e.Evaluate(ctx, service("shop", nil), port, node, endpoints("zone-a")); !slices.Equal(v.Weights, []uint32{7}) {
			t.Errorf("after the refused reload: %s, want the running chain's [7]", v)
		}

		err = within(t, "shadow "+path, func() error { return e.Reload(ctx, withShadow(base, "next", path, "weighted", nil)) })
		if err != nil {
			t.Errorf("shadow %s: the reload was refused: %v", path, err)
		}
		rep := e.ShadowReport("")
		if len(rep.Modules) != 1 || rep.Modules[0].Loaded || !strings.Contains(rep.Modules[0].LoadErr, want) {
			t.Errorf("shadow %s: report %+v, want it left out with %q", path, rep.Modules, want)
		}

		err = within(t, "check "+path, func() error {
			_, err := policychain.CheckFile(ctx, config.Default().Policy, path, nil)
			return err
		})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("module check %s: %v, want an error containing %q", path, err, want)
		}
	}
}

// TestModuleReadRefusesOversize: a file over policy.maxModuleSize is
// refused by its size, naming the path and the limit.
func TestModuleReadRefusesOversize(t *testing.T) {
	ctx := context.Background()
	big := filepath.Join(t.TempDir(), "big.wasm")
	if err := os.WriteFile(big, make([]byte, 64<<10+1), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := policyConfig(map[string]string{"m": big}, config.Chain{Name: "c", Modules: []config.ChainStep{{Module: "m"}}})
	cfg.MaxModuleSize = 64 << 10
	want := big + ": larger than policy.maxModuleSize (65537 bytes, limit 65536)"
	if _, err := policychain.New(ctx, cfg, stateDir, nil, nil); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("load: %v, want an error containing %q", err, want)
	}
	if _, err := policychain.CheckFile(ctx, cfg, big, nil); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("module check: %v, want an error containing %q", err, want)
	}
}
