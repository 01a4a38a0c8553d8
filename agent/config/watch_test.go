package config

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/internal/testkit/logbuf"
)

const baseYAML = `
mode: iptables
sync:
  minPeriod: 1s
  period: 30s
log:
  level: info
`

// waitFor polls cond until it holds or a generous deadline passes. It
// bounds the wait; it does not measure speed.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// metric reads one sample from a real registry; -1 when absent.
func metric(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == ""
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					match = true
				}
			}
			if !match {
				continue
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// replaceFile writes content to a temporary file in the same directory and
// renames it over path, as editors and config management tools do.
func replaceFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

type harness struct {
	t       *testing.T
	path    string
	reg     *prometheus.Registry
	w       *Watcher
	logs    *logbuf.Buffer
	mu      sync.Mutex
	changes [][2]*Config
}

func (h *harness) changeCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.changes)
}

func (h *harness) reloads(result string) float64 {
	return metric(h.t, h.reg, "edgeproxy_config_reload_total", "result", result)
}

// startWatcher loads the file at path and runs a Watcher on it until the
// test ends.
func startWatcher(t *testing.T, path string, env []string) *harness {
	t.Helper()
	h := &harness{t: t, path: path, reg: prometheus.NewRegistry(), logs: &logbuf.Buffer{}}
	opts := LoadOptions{File: path, Env: env, Hostname: fixedHost("host-a"), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	initial := mustLoad(t, opts)
	w, err := NewWatcher(initial, WatcherOptions{
		Load:       opts,
		Registerer: h.reg,
		Logger:     slog.New(slog.NewTextHandler(h.logs, nil)),
		Debounce:   20 * time.Millisecond,
		OnChange: func(prev, next *Config) error {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.changes = append(h.changes, [2]*Config{prev, next})
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	h.w = w
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("Run did not return after cancel")
		}
	})
	return h
}

// settle makes one good edit and waits for it, so the watch is known to be
// in place (Run reloads once after adding the watch) before the edit under
// test.
func (h *harness) settle(t *testing.T) {
	t.Helper()
	replaceFile(t, h.path, baseYAML+"nodeLabels: [settled]\n")
	waitFor(t, "the settling edit", func() bool {
		return slices.Equal(h.w.Current().NodeLabels, []string{"settled"})
	})
}

func TestWatcherAppliesGoodEdit(t *testing.T) {
	path := writeFile(t, t.TempDir(), "edgeproxy.yaml", baseYAML)
	h := startWatcher(t, path, nil)
	first := h.w.Current()

	// In-place write (truncate + write), as some editors do.
	if err := os.WriteFile(path, []byte(strings.NewReplacer("30s", "10s", "info", "debug").Replace(baseYAML)), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "sync.period and log.level to apply", func() bool {
		c := h.w.Current()
		return c.Sync.Period == 10*time.Second && c.Log.Level == "debug"
	})
	if first.Sync.Period != 30*time.Second || first.Log.Level != "info" {
		t.Fatalf("the previous config value was modified: %+v", first)
	}
	if h.changeCount() == 0 {
		t.Fatal("OnChange not called")
	}
	h.mu.Lock()
	last := h.changes[len(h.changes)-1]
	h.mu.Unlock()
	if last[1] != h.w.Current() || last[1].Sync.Period != 10*time.Second {
		t.Fatalf("OnChange got %+v, Current is %+v", last[1], h.w.Current())
	}
	if got := h.reloads("success"); got < 1 {
		t.Fatalf("reload success = %v", got)
	}
	if got := h.reloads("error"); got != 0 {
		t.Fatalf("reload error = %v", got)
	}
}

func TestWatcherKeepsOldConfigOnBadEdit(t *testing.T) {
	path := writeFile(t, t.TempDir(), "edgeproxy.yaml", baseYAML)
	h := startWatcher(t, path, nil)
	h.settle(t)
	before := h.w.Current()
	changes := h.changeCount()

	replaceFile(t, path, strings.Replace(baseYAML, "minPeriod: 1s", "minPeriod: abc", 1)+"nodeLabels: [bad]\n")
	waitFor(t, "the bad edit to be counted", func() bool { return h.reloads("error") >= 1 })
	if h.w.Current() != before || h.changeCount() != changes {
		t.Fatalf("bad edit changed the config: %+v", h.w.Current())
	}
	if !strings.Contains(h.logs.String(), `config: sync.minPeriod: \"abc\" is not a duration`) {
		t.Fatalf("the log does not say why: %s", h.logs.String())
	}

	// A YAML syntax error is rejected the same way.
	replaceFile(t, path, "sync: [\n")
	waitFor(t, "the syntax error to be counted", func() bool { return h.reloads("error") >= 2 })
	if h.w.Current() != before {
		t.Fatal("syntax error changed the config")
	}

	// Defect 6 of issue 14: a file truncated to empty (an editor's
	// half-written save) is not "all defaults".
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the empty file to be counted", func() bool { return h.reloads("empty") >= 1 })
	if h.w.Current() != before {
		t.Fatal("an empty file changed the config")
	}

	// Fixing the file applies it.
	replaceFile(t, path, strings.Replace(baseYAML, "info", "warn", 1))
	waitFor(t, "the fix to apply", func() bool { return h.w.Current().Log.Level == "warn" })
}

func TestWatcherSeesRenameReplace(t *testing.T) {
	path := writeFile(t, t.TempDir(), "edgeproxy.yaml", baseYAML)
	h := startWatcher(t, path, nil)
	h.settle(t)
	replaceFile(t, path, strings.Replace(baseYAML, "minPeriod: 1s", "minPeriod: 5s", 1))
	waitFor(t, "the renamed-in file to apply", func() bool { return h.w.Current().Sync.MinPeriod == 5*time.Second })
	// And again: the watch survives the replaced inode.
	replaceFile(t, path, strings.Replace(baseYAML, "minPeriod: 1s", "minPeriod: 6s", 1))
	waitFor(t, "the second rename to apply", func() bool { return h.w.Current().Sync.MinPeriod == 6*time.Second })
}

// TestWatcherSeesConfigMapSwap lays the file out as a Kubernetes ConfigMap
// volume does (file -> ..data/file, ..data -> ..<timestamp>) and swaps the
// ..data symlink.
func TestWatcherSeesConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	version := func(name, content string) {
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, name), "edgeproxy.yaml", content)
	}
	version("..v1", baseYAML)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink("..v1", filepath.Join(dir, "..data")))
	must(os.Symlink("..data/edgeproxy.yaml", filepath.Join(dir, "edgeproxy.yaml")))
	h := startWatcher(t, filepath.Join(dir, "edgeproxy.yaml"), nil)

	swap := func(name, content string) {
		version(name, content)
		must(os.Symlink(name, filepath.Join(dir, "..data_tmp")))
		must(os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	}
	swap("..v2", strings.Replace(baseYAML, "info", "error", 1))
	waitFor(t, "the ..v2 swap to apply", func() bool { return h.w.Current().Log.Level == "error" })
	swap("..v3", strings.Replace(baseYAML, "info", "debug", 1))
	waitFor(t, "the ..v3 swap to apply", func() bool { return h.w.Current().Log.Level == "debug" })
}

func TestWatcherHoldsRestartOnlyKeys(t *testing.T) {
	path := writeFile(t, t.TempDir(), "edgeproxy.yaml", baseYAML)
	h := startWatcher(t, path, nil)
	h.settle(t)
	gauge := func() float64 { return metric(t, h.reg, "edgeproxy_config_restart_required", "", "") }
	if g := gauge(); g != 0 {
		t.Fatalf("restart_required = %v before any restart-only edit", g)
	}

	edited := strings.NewReplacer("mode: iptables", "mode: plan", "level: info", "level: debug").Replace(baseYAML) +
		"nodeName: other\nserver:\n  metrics: 127.0.0.1:9999\n"
	replaceFile(t, path, edited)
	waitFor(t, "log.level to apply", func() bool { return h.w.Current().Log.Level == "debug" })
	c := h.w.Current()
	if c.Mode != "iptables" || c.NodeName != "host-a" || c.Server.Metrics != "127.0.0.1:10249" {
		t.Fatalf("restart-only keys were applied: mode %q nodeName %q metrics %q", c.Mode, c.NodeName, c.Server.Metrics)
	}
	if got, want := h.w.RestartRequired(), []string{"nodeName", "mode", "server.metrics"}; !slices.Equal(got, want) {
		t.Fatalf("RestartRequired = %v, want %v", got, want)
	}
	if g := gauge(); g != 1 {
		t.Fatalf("restart_required = %v", g)
	}
	logs := h.logs.String()
	for _, want := range []string{"key=mode running=iptables file=plan", "key=nodeName running=host-a file=other"} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}

	// Reverting the restart-only keys clears the flag.
	replaceFile(t, path, strings.Replace(baseYAML, "level: info", "level: warn", 1))
	waitFor(t, "the revert to apply", func() bool { return h.w.Current().Log.Level == "warn" })
	if g := gauge(); g != 0 || len(h.w.RestartRequired()) != 0 {
		t.Fatalf("restart_required = %v, %v after revert", g, h.w.RestartRequired())
	}
}

// TestWatcherKeepsEnvAndFlagsOnReload: the file is only one layer; env vars
// keep overriding it after a reload.
func TestWatcherKeepsEnvAndFlagsOnReload(t *testing.T) {
	path := writeFile(t, t.TempDir(), "edgeproxy.yaml", baseYAML)
	h := startWatcher(t, path, []string{"EDGEPROXY_SYNC_PERIOD=45s"})
	if h.w.Current().Sync.Period != 45*time.Second {
		t.Fatal("env not applied at start")
	}
	replaceFile(t, path, strings.NewReplacer("period: 30s", "period: 10s", "info", "debug").Replace(baseYAML))
	waitFor(t, "log.level to apply", func() bool { return h.w.Current().Log.Level == "debug" })
	if p := h.w.Current().Sync.Period; p != 45*time.Second {
		t.Fatalf("sync.period = %v, want the env's 45s", p)
	}
}

func TestWatcherReloadNow(t *testing.T) {
	path := writeFile(t, t.TempDir(), "edgeproxy.yaml", baseYAML)
	opts := LoadOptions{File: path, Hostname: fixedHost("h")}
	w, err := NewWatcher(mustLoad(t, opts), WatcherOptions{Load: opts, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Dir(path), "edgeproxy.yaml", strings.Replace(baseYAML, "info", "error", 1))
	if err := w.Reload(); err != nil || w.Current().Log.Level != "error" {
		t.Fatalf("Reload: %v, level %q", err, w.Current().Log.Level)
	}
	writeFile(t, filepath.Dir(path), "edgeproxy.yaml", "mode: foo\n")
	var fe *FieldError
	if err := w.Reload(); !errors.As(err, &fe) || fe.Key != "mode" || w.Current().Log.Level != "error" {
		t.Fatalf("Reload of a bad file: %v, level %q", err, w.Current().Log.Level)
	}
}

func TestNewWatcherErrors(t *testing.T) {
	c := Default()
	if _, err := NewWatcher(&c, WatcherOptions{}); err == nil {
		t.Error("no file: want an error")
	}
	path := writeFile(t, t.TempDir(), "c.yaml", baseYAML)
	reg := prometheus.NewRegistry()
	opts := WatcherOptions{Load: LoadOptions{File: path}, Registerer: reg}
	if _, err := NewWatcher(&c, opts); err != nil {
		t.Fatal(err)
	}
	if _, err := NewWatcher(&c, opts); err == nil || !strings.Contains(err.Error(), "register metrics") {
		t.Errorf("second registration: %v", err)
	}
	if got := metric(t, reg, "edgeproxy_config_reload_total", "result", "error"); got != 0 {
		t.Errorf("error counter not exported at 0: %v", got)
	}
}

func TestWatcherRunEndsWithContext(t *testing.T) {
	path := writeFile(t, t.TempDir(), "edgeproxy.yaml", baseYAML)
	opts := LoadOptions{File: path, Hostname: fixedHost("h")}
	before := runtime.NumGoroutine()
	w, err := NewWatcher(mustLoad(t, opts), WatcherOptions{Load: opts, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	replaceFile(t, path, strings.Replace(baseYAML, "info", "warn", 1))
	waitFor(t, "the edit to apply", func() bool { return w.Current().Log.Level == "warn" })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	waitFor(t, "the watcher's goroutines to end", func() bool { return runtime.NumGoroutine() <= before })

	// Run on a directory that does not exist fails instead of hanging.
	gone := filepath.Join(t.TempDir(), "gone", "c.yaml")
	w2, err := NewWatcher(mustLoad(t, opts), WatcherOptions{Load: LoadOptions{File: gone}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w2.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "gone") {
		t.Fatalf("Run on a missing directory: %v", err)
	}
}

// TestWatcherFollowsSymlinkElsewhere: the config path links to a file in
// another directory, which is edited there.
func TestWatcherFollowsSymlinkElsewhere(t *testing.T) {
	etc, store := t.TempDir(), t.TempDir()
	target := writeFile(t, store, "real.yaml", baseYAML)
	link := filepath.Join(etc, "edgeproxy.yaml")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	h := startWatcher(t, link, nil)
	replaceFile(t, target, strings.Replace(baseYAML, "info", "warn", 1))
	waitFor(t, "the edit at the link target to apply", func() bool { return h.w.Current().Log.Level == "warn" })

	// Point the link somewhere else, then edit the new target.
	other := writeFile(t, t.TempDir(), "other.yaml", strings.Replace(baseYAML, "info", "error", 1))
	if err := os.Symlink(other, link+".new"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(link+".new", link); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the relinked file to apply", func() bool { return h.w.Current().Log.Level == "error" })
	replaceFile(t, other, strings.Replace(baseYAML, "info", "debug", 1))
	waitFor(t, "the edit at the new target to apply", func() bool { return h.w.Current().Log.Level == "debug" })
}
