package agent

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Before its first sync an agent is healthy within the health timeout
// (kube-proxy: "healthy while it's starting up"), unless its API server
// has never answered: kube-proxy then serves no health at all, and the
// agent says unhealthy. Once a first sync programmed the kernel (a
// snapshot, while the API server is still away) it is healthy.
func TestHealthBeforeAPIServerAnswers(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	// Nothing listens on port 1: never asked here (the agent is not run),
	// and it would not answer if it were.
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {token: t}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		kubeconfig string // "": a manifest source
		want       bool
	}{
		{"manifests", "", true},
		{"API server never answered", kubeconfig, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := planConfig(t, t.TempDir())
			cfg.Sync.HealthTimeout = time.Minute
			if tc.kubeconfig != "" {
				cfg.Manifests, cfg.Kubeconfig = "", tc.kubeconfig
			}
			a, err := New(Options{Config: &cfg, Backend: &flaky{}, Registry: prometheus.NewRegistry(),
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			if h := a.HealthNow(now); h.Healthy != tc.want {
				t.Errorf("health at start = %+v, want healthy %t", h, tc.want)
			}
			a.firstSynced.Store(now.UnixNano())
			if h := a.HealthNow(now); !h.Healthy {
				t.Errorf("health once the first sync programmed = %+v, want healthy", h)
			}
		})
	}
}
