package snapshot

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath"
)

// failingWriter passes the first n bytes through and then fails, as a full
// disk or an I/O error half-way through the write would.
type failingWriter struct {
	w io.Writer
	n int
}

var errDiskFull = errors.New("no space left on device (simulated)")

func (f *failingWriter) Write(p []byte) (int, error) {
	if len(p) <= f.n {
		f.n -= len(p)
		return f.w.Write(p)
	}
	n, _ := f.w.Write(p[:f.n])
	f.n = 0
	return n, errDiskFull
}

// A write that fails part-way leaves the previous snapshot intact and
// loadable, and leaves no temp file behind.
func TestFailedSaveKeepsOld(t *testing.T) {
	dir := t.TempDir()
	old := &Snapshot{Written: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), Plan: datapath.Plan{Generation: 1}}
	if err := Save(dir, old); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(Path(dir))
	if err != nil {
		t.Fatal(err)
	}

	wrapWriter = func(w io.Writer) io.Writer { return &failingWriter{w: w, n: 40} }
	t.Cleanup(func() { wrapWriter = nil })
	next := &Snapshot{Written: time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC), Plan: datapath.Plan{Generation: 2}}
	err = Save(dir, next)
	if !errors.Is(err, errDiskFull) {
		t.Fatalf("Save with a failing write = %v, want the write error", err)
	}

	after, err := os.ReadFile(Path(dir))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Fatal("the old snapshot file changed although the new save failed")
	}
	got, err := Load(dir)
	if err != nil {
		t.Fatalf("old snapshot no longer loads: %v", err)
	}
	if got.Plan.Generation != 1 {
		t.Fatalf("Load returned generation %d, want the old 1", got.Plan.Generation)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 {
		for _, e := range ents {
			t.Log(e.Name())
		}
		t.Fatalf("%d files in the state directory after a failed save, want only the snapshot", len(ents))
	}
}
