package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/internal/testkit/logbuf"
	"github.com/edgeproxy/edgeproxy/modules/modbuild"
)

// Defect 6 of issue 14: a reload whose policy modules are refused is
// counted as an error, and the config shown (Config, /debug/status) keeps
// the chains that actually run.
func TestPolicyReloadFailureIsAnError(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	path := filepath.Join(dir, "c.yaml")
	base := "nodeName: n1\nmode: plan\nmanifests: " + dir + "\nstateDir: " + state + "\nserver: {healthz: \"\", metrics: \"\"}\n"
	if err := os.WriteFile(path, []byte(base), 0o644); err != nil {
		t.Fatal(err)
	}
	a, reg := startFromFile(t, path, io.Discard)

	bad := base + "log: {level: debug}\npolicy:\n  modules: [{name: m, path: " + filepath.Join(dir, "missing.wasm") + "}]\n  chains: [{name: c, modules: [{module: m}]}]\n"
	if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	reloads := func(result string) float64 {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() != "edgeproxy_config_reload_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "result" && l.GetValue() == result {
						return m.GetCounter().GetValue()
					}
				}
			}
		}
		return 0
	}
	eventually(t, "the failed policy reload counted as an error", func() bool { return reloads("error") >= 1 })
	if c := a.Config(); len(c.Policy.Chains) != 0 || c.Log.Level != "debug" {
		t.Errorf("config in force: chains %v (want none: they are not running), log level %q (want debug: the rest applies)", c.Policy.Chains, c.Log.Level)
	}
}

// TestModuleReadNeverHoldsSyncs (issue 29 §1): a FIFO as a shadow's path
// on a config reload, and /dev/zero as a chain module's, are refused at
// once (the shadow left out, the module's reload counted as an error),
// and a Service change after each is planned. The FIFO used to block the
// reload, and with it every sync, until something wrote into it.
func TestModuleReadNeverHoldsSyncs(t *testing.T) {
	if _, err := os.Stat("/dev/zero"); err != nil {
		t.Skip("no /dev/zero on this system")
	}
	dir := t.TempDir()
	manifests := filepath.Join(dir, "manifests")
	if err := os.Mkdir(manifests, 0o755); err != nil {
		t.Fatal(err)
	}
	writeService := func(port int) {
		m := fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: t}\nspec: {clusterIP: 10.96.0.5, ports: [{port: %d}]}\n", port)
		if err := os.WriteFile(filepath.Join(manifests, "web.yaml"), []byte(m), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeService(80)
	weighted := filepath.Join(dir, "weighted.wasm")
	if err := os.WriteFile(weighted, modbuild.Build(t, "modules/weighted"), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "next.wasm")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatalf("mkfifo: %v", err)
	}
	path := filepath.Join(dir, "c.yaml")
	// The interpreter: a cold compile under -race on a busy machine can
	// take minutes, and compiling is not what this test is about.
	base := "nodeName: n1\nmode: plan\nmanifests: " + manifests + "\nstateDir: " + filepath.Join(dir, "state") +
		"\nserver: {healthz: \"\", metrics: \"\"}\nsync: {minPeriod: 10ms}\npolicy:\n  engine: interpreter\n"
	if err := os.WriteFile(path, []byte(base), 0o644); err != nil {
		t.Fatal(err)
	}
	logs := &logbuf.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", logs)
		}
	})
	a, reg := startFromFile(t, path, logs)

	planned := func(port uint16) func() bool {
		return func() bool { return planShows(a, port) }
	}
	reloads := func(result string) func() float64 {
		return func() float64 { return gathered(reg, "edgeproxy_config_reload_total", "result", result) }
	}

	shadow := base + "  modules:\n  - {name: weighted, path: " + weighted + "}\n  - {name: next, path: " + fifo +
		", shadowOf: weighted}\n  chains: [{name: c, modules: [{module: weighted}]}]\n"
	ok := reloads("success")()
	if err := os.WriteFile(path, []byte(shadow), 0o644); err != nil {
		t.Fatal(err)
	}
	// The reload used to block for good: the wait is long, not a measure.
	patiently(t, "the reload with a FIFO shadow applied", func() bool { return reloads("success")() > ok })
	if c := a.Config(); len(c.Policy.Chains) != 1 {
		t.Fatalf("chains in force %v, want the new one", c.Policy.Chains)
	}
	if want := fifo + ": not a regular file (a named pipe)"; !strings.Contains(logs.String(), want) {
		t.Errorf("no log line says %q:\n%s", want, logs)
	}
	writeService(81)
	eventually(t, "a Service change after the FIFO shadow planned", planned(81))

	zero := base + "  modules:\n  - {name: weighted, path: /dev/zero}\n  chains: [{name: c, modules: [{module: weighted}]}]\n"
	if err := os.WriteFile(path, []byte(zero), 0o644); err != nil {
		t.Fatal(err)
	}
	patiently(t, "the reload with /dev/zero refused", func() bool { return reloads("error")() >= 1 })
	if want := "/dev/zero: not a regular file (a character device)"; !strings.Contains(logs.String(), want) {
		t.Errorf("no log line says %q:\n%s", want, logs)
	}
	writeService(82)
	eventually(t, "a Service change after the /dev/zero module planned", planned(82))
}

// startFromFile starts an agent on the config file at path, which it
// watches (an edit reloads it), logging to w. The agent runs until t
// ends; startFromFile returns once its first sync is done, with the
// agent's registry.
func startFromFile(t *testing.T, path string, w io.Writer) (*Agent, *prometheus.Registry) {
	t.Helper()
	lo := config.LoadOptions{File: path, Logger: slog.New(slog.NewTextHandler(w, nil))}
	cfg, err := config.Load(lo)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	a, err := New(Options{Config: cfg, Load: lo, Registry: reg, Logger: lo.Logger})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	<-a.Synced()
	return a, reg
}

// planShows reports whether a's last plan has a frontend on port.
func planShows(a *Agent, port uint16) bool {
	res := a.Last()
	if res == nil || res.Plan == nil {
		return false
	}
	for _, f := range res.Plan.Frontends {
		if f.Port == port {
			return true
		}
	}
	return false
}

// patiently waits up to five minutes for cond: for work whose time a
// loaded machine stretches (a module load), where the test asks only
// that it ends.
func patiently(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5 minutes", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// gathered returns the value of the counter name whose label is value.
func gathered(reg *prometheus.Registry, name, label, value string) float64 {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
