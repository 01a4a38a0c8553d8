package agent

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/snapshot"
)

// A snapshot that cannot be written is counted on every try, logged once
// until a write succeeds again, and leaves the age of the last good one.
func TestSnapshotWriteFailureIsCountedAndLoggedOnce(t *testing.T) {
	stateDir := filepath.Join(t.TempDir(), "state")
	if err := os.WriteFile(stateDir, nil, 0o600); err != nil { // a file: every write fails
		t.Fatal(err)
	}
	a, log := snapshotAgent(t, stateDir)
	s := &snapshot.Snapshot{Written: time.Now()}
	a.mu.Lock()
	defer a.mu.Unlock()
	for range 3 {
		if a.writeSnapshot(s) {
			t.Fatal("a write into a file as state directory succeeded")
		}
	}
	if n := testutil.ToFloat64(a.metrics.snapshotWriteFailures); n != 3 {
		t.Errorf("edgeproxy_snapshot_write_failures_total = %v, want 3", n)
	}
	if n := strings.Count(log.String(), "cannot write the snapshot"); n != 1 {
		t.Errorf("logged %d times, want once:\n%s", n, log.String())
	}
	if age := a.snapshotAgeSeconds(); age != -1 {
		t.Errorf("snapshot age = %v after failed writes only, want -1", age)
	}
	if err := os.Remove(stateDir); err != nil {
		t.Fatal(err)
	}
	if !a.writeSnapshot(s) {
		t.Fatal("the write after the fault was gone failed")
	}
	if !strings.Contains(log.String(), "the snapshot is written again") {
		t.Errorf("recovery not logged:\n%s", log.String())
	}
	// A clock stepped back: the snapshot looks written in the future.
	a.snapAge.Store(time.Now().Add(time.Hour).UnixNano())
	if age := a.snapshotAgeSeconds(); age != 0 {
		t.Errorf("snapshot age = %v for a snapshot from the future, want 0", age)
	}
}

// snapshotAgent is an agent (not running) whose state is in stateDir and
// whose log is returned.
func snapshotAgent(t *testing.T, stateDir string) (*Agent, *bytes.Buffer) {
	t.Helper()
	cfg := config.Default()
	cfg.NodeName, cfg.Manifests, cfg.Mode, cfg.StateDir = "n1", t.TempDir(), "plan", stateDir
	cfg.Server = config.Server{}
	log := &bytes.Buffer{}
	a, err := New(Options{Config: &cfg, Backend: &flaky{}, Registry: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return a, log
}

// Issue 29 §7: a stateDir that is a symlink loop is named as one in the
// log of a failed snapshot write (MkdirAll said "file exists").
func TestSnapshotWriteNamesASymlinkLoop(t *testing.T) {
	stateDir := filepath.Join(t.TempDir(), "state")
	if err := os.Symlink(stateDir, stateDir); err != nil {
		t.Fatal(err)
	}
	a, log := snapshotAgent(t, stateDir)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.writeSnapshot(&snapshot.Snapshot{Written: time.Now()}) {
		t.Fatal("a write into a symlink loop succeeded")
	}
	if !strings.Contains(log.String(), stateDir+" is a loop of symbolic links") {
		t.Errorf("the log does not name the loop:\n%s", log.String())
	}
}
