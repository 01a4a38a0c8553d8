package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/config"
)

// brokenSource fails at once and never lists anything.
type brokenSource struct{}

func (brokenSource) Run(context.Context) error { return errors.New("list refused") }
func (brokenSource) WaitForSync(ctx context.Context) bool {
	<-ctx.Done()
	return false
}

// A part that fails stops the agent with its error, even while Run still
// waits for the source to list everything.
func TestRunStopsWhenAPartFails(t *testing.T) {
	cfg := config.Default()
	cfg.NodeName, cfg.Manifests, cfg.Mode = "n1", t.TempDir(), "plan"
	cfg.StateDir = t.TempDir()
	cfg.Server = config.Server{}
	a, err := New(Options{Config: &cfg, Backend: &flaky{}, Registry: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	a.source = brokenSource{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	select {
	case err = <-done:
	case <-time.After(time.Minute): // a bound on a hang, not a speed
		cancel()
		<-done
		t.Fatal("Run still runs a minute after its source failed")
	}
	if err == nil || !strings.Contains(err.Error(), "source: list refused") {
		t.Fatalf("Run = %v, want the source's error", err)
	}
	select {
	case <-a.Synced():
		t.Error("synced without a source")
	default:
	}
}
