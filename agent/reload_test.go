package agent

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/config"
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
	lo := config.LoadOptions{File: path, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
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
