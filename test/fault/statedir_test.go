package fault

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/agent/snapshot"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
)

// The state directory full (a 256 KiB tmpfs, filled): writing the snapshot
// fails with ENOSPC, the previous snapshot stays intact and loadable, and
// no temporary file is left behind. The agent's side (the failure counted
// in edgeproxy_snapshot_write_failures_total, logged once, tried again on
// every sync) is agent TestSnapshotWriteFailureIsCountedAndLoggedOnce.
func TestStateDirFull(t *testing.T) {
	gate.Root(t)
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "size=256k,mode=0700"); err != nil {
		t.Fatalf("mount a small tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	first := &snapshot.Snapshot{Written: time.Unix(1_700_000_000, 0).UTC(), Services: []model.Service{{Namespace: "t", Name: "old"}}}
	if err := snapshot.Save(dir, first); err != nil {
		t.Fatal(err)
	}
	fill(t, filepath.Join(dir, "filler"))

	second := &snapshot.Snapshot{Written: first.Written.Add(time.Hour), Services: []model.Service{{Namespace: "t", Name: strings.Repeat("n", 5000)}}}
	err := snapshot.Save(dir, second)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Save on a full disk: %v, want ENOSPC", err)
	}
	got, err := snapshot.Load(dir)
	if err != nil {
		t.Fatalf("the previous snapshot is damaged: %v", err)
	}
	if !got.Written.Equal(first.Written) || len(got.Services) != 1 || got.Services[0].Name != "old" {
		t.Errorf("the previous snapshot changed: written %v, services %v", got.Written, got.Services)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
	// Space again: the next write succeeds.
	if err := os.Remove(filepath.Join(dir, "filler")); err != nil {
		t.Fatal(err)
	}
	if err := snapshot.Save(dir, second); err != nil {
		t.Fatalf("Save after space was freed: %v", err)
	}
}

// fill writes to path until the file system is full.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for range 1024 { // 4 MiB at most: bounded even if the mount were larger
		if _, err := f.Write(buf); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return
			}
			t.Fatal(err)
		}
	}
	t.Fatal("the file system never filled")
}
