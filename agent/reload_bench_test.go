package agent

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/modules/modbuild"
)

// BenchmarkChangeLatencyDuringReload measures what issue 29 §1 measured by
// hand: the time from a Service change in a manifest directory to the plan
// showing it (plan mode, sync.minPeriod 50ms), "alone" and "reload" while a
// config reload adds two Go modules (weighted, scheduler) that compile
// cold. Each iteration gives the modules a new custom section, so their
// hashes are new and nothing comes from the compilation cache. ms/change
// is the metric; the manifest source's 200 ms quiet period is part of it.
// reload-ms is how long the reloads took, to show that the change landed
// while one was running.
func BenchmarkChangeLatencyDuringReload(b *testing.B) {
	wasm := map[string][]byte{
		"weighted":  modbuild.Build(b, "modules/weighted"),
		"scheduler": modbuild.Build(b, "modules/scheduler"),
	}
	dir := b.TempDir()
	manifests := filepath.Join(dir, "manifests")
	if err := os.Mkdir(manifests, 0o755); err != nil {
		b.Fatal(err)
	}
	svc := filepath.Join(manifests, "web.yaml")
	writeService := func(port int) {
		m := fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: t}\nspec: {clusterIP: 10.96.0.5, ports: [{port: %d}]}\n", port)
		if err := os.WriteFile(svc, []byte(m), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	writeService(1000)
	path := filepath.Join(dir, "c.yaml")
	base := "nodeName: n1\nmode: plan\nmanifests: " + manifests + "\nstateDir: " + filepath.Join(dir, "state") +
		"\nserver: {healthz: \"\", metrics: \"\"}\nsync: {minPeriod: 50ms}\n"
	writeConfig := func(nonce int) {
		s := base
		if nonce > 0 {
			s += "policy:\n  modules:\n"
			for _, name := range []string{"weighted", "scheduler"} {
				p := filepath.Join(dir, fmt.Sprintf("%s-%d.wasm", name, nonce))
				if err := os.WriteFile(p, withCustomSection(wasm[name], uint64(nonce)), 0o644); err != nil {
					b.Fatal(err)
				}
				s += "  - {name: " + name + ", path: " + p + "}\n"
			}
			// The chain matches no Service: the reload is what is measured,
			// not the modules' evaluation.
			s += "  chains: [{name: c, match: {namespaces: [elsewhere]}, modules: [{module: weighted}, {module: scheduler}]}]\n"
		}
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	writeConfig(0)
	lo := config.LoadOptions{File: path, Logger: slog.New(slog.DiscardHandler)}
	cfg, err := config.Load(lo)
	if err != nil {
		b.Fatal(err)
	}
	a, err := New(Options{Config: cfg, Load: lo, Registry: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	<-a.Synced()

	port := 1000
	// change makes one Service change and returns how long the plan took
	// to show it.
	change := func(b *testing.B) time.Duration {
		port++
		start := time.Now()
		writeService(port)
		deadline := start.Add(30 * time.Second)
		for !planShows(a, uint16(port)) {
			if time.Now().After(deadline) {
				b.Fatalf("port %d not in the plan after 30s", port)
			}
			time.Sleep(time.Millisecond)
		}
		return time.Since(start)
	}
	nonce := 0
	run := func(b *testing.B, reload bool) {
		var total, reloads time.Duration
		for b.Loop() {
			if !reload {
				total += change(b)
				continue
			}
			nonce++
			writeConfig(nonce)
			rstart := time.Now()
			rdone := make(chan error, 1)
			go func() { rdone <- a.watcher.Reload() }()
			time.Sleep(20 * time.Millisecond) // the reload is compiling
			total += change(b)
			if err := <-rdone; err != nil {
				b.Fatalf("reload: %v", err)
			}
			reloads += time.Since(rstart)
		}
		b.ReportMetric(float64(total.Microseconds())/1e3/float64(b.N), "ms/change")
		if reload {
			b.ReportMetric(float64(reloads.Microseconds())/1e3/float64(b.N), "reload-ms")
		}
	}
	b.Run("alone", func(b *testing.B) { run(b, false) })
	b.Run("reload", func(b *testing.B) { run(b, true) })
}

// withCustomSection returns wasm with a custom section holding nonce
// appended: the same code under a new hash.
func withCustomSection(wasm []byte, nonce uint64) []byte {
	const name = "nonce"
	payload := append([]byte{byte(len(name))}, name...)
	payload = binary.LittleEndian.AppendUint64(payload, nonce)
	out := append([]byte(nil), wasm...)
	out = append(out, 0) // custom section id
	out = binary.AppendUvarint(out, uint64(len(payload)))
	return append(out, payload...)
}
