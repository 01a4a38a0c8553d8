package agent

import (
	"bytes"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/edgeproxy/edgeproxy/agent/snapshot"
	"github.com/edgeproxy/edgeproxy/datapath"
)

// gatedWriter is a snapshotWriter into a temporary directory whose writes
// wait for the test's word before they reach the disk.
type gatedWriter struct {
	*snapshotWriter
	started chan time.Time // the stamp of each write as it starts
	gate    chan struct{}  // one receive lets one write go on
	age     atomic.Int64
	log     bytes.Buffer
}

func newGatedWriter(t *testing.T, dir string) *gatedWriter {
	g := &gatedWriter{started: make(chan time.Time, 8), gate: make(chan struct{})}
	g.snapshotWriter = newSnapshotWriter(dir, slog.New(slog.NewTextHandler(&g.log, nil)),
		prometheus.NewCounter(prometheus.CounterOpts{Name: "failures"}), &g.age)
	g.save = func(dir string, s *snapshot.Snapshot) error {
		g.started <- s.Written
		<-g.gate
		return snapshot.Save(dir, s)
	}
	t.Cleanup(func() { close(g.gate); g.wait() })
	return g
}

// flushAt flushes a snapshot stamped now; it reports whether build ran.
func (g *gatedWriter) flushAt(now time.Time, interval time.Duration) bool {
	built := false
	g.flush(now, interval, func(now time.Time) *snapshot.Snapshot {
		built = true
		return &snapshot.Snapshot{Written: now}
	})
	return built
}

var changedPlan = &datapath.Plan{Changed: map[datapath.ServicePortName]bool{{Namespace: "t", Name: "web"}: true}}

// One write runs at a time: a plan programmed meanwhile stays dirty, and
// the next flush after the write writes it; the file on disk is the last
// one written, and its stamp is the age the metrics read.
func TestSnapshotWriterWritesOneAtATime(t *testing.T) {
	dir := t.TempDir()
	w := newGatedWriter(t, dir)
	t0 := time.Unix(1_700_000_000, 0)
	if w.flushAt(t0, 0) {
		t.Fatal("a flush with nothing programmed built a snapshot")
	}
	w.note(changedPlan)
	if !w.flushAt(t0, 0) {
		t.Fatal("a flush after a changed plan built nothing")
	}
	<-w.started
	w.note(changedPlan)
	if w.flushAt(t0.Add(time.Second), 0) {
		t.Fatal("a flush while a write runs built another snapshot")
	}
	if !w.pending() {
		t.Fatal("the plan programmed during a write is not pending")
	}
	w.gate <- struct{}{}
	w.wait()
	if got := time.Unix(0, w.age.Load()); !got.Equal(t0) {
		t.Fatalf("age stamp %v after the first write, want %v", got, t0)
	}
	if !w.flushAt(t0.Add(2*time.Second), 0) {
		t.Fatal("the pending plan was not written by the next flush")
	}
	<-w.started
	w.gate <- struct{}{}
	w.wait()
	s, err := snapshot.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := t0.Add(2 * time.Second); !s.Written.Equal(want) {
		t.Errorf("snapshot on disk written %v, want %v", s.Written, want)
	}
	if w.pending() {
		t.Error("still pending after the write")
	}
}

// Writes are at least interval apart; the plan in between waits for the
// flush after it, an idle sync's included.
func TestSnapshotWriterKeepsTheInterval(t *testing.T) {
	w := newGatedWriter(t, t.TempDir())
	t0 := time.Unix(1_700_000_000, 0)
	w.note(changedPlan)
	w.flushAt(t0, time.Minute)
	<-w.started
	w.gate <- struct{}{}
	w.wait()
	w.note(changedPlan)
	if w.flushAt(t0.Add(30*time.Second), time.Minute) {
		t.Fatal("wrote again within the interval")
	}
	if !w.pending() {
		t.Fatal("the plan put off by the interval is not pending")
	}
	if !w.flushAt(t0.Add(time.Minute), time.Minute) {
		t.Fatal("the plan put off was not written once the interval passed")
	}
	<-w.started
	w.gate <- struct{}{}
}

// Only a plan that changed something makes the snapshot dirty, but the
// first full plan does while nothing is written yet.
func TestSnapshotWriterNote(t *testing.T) {
	w := newGatedWriter(t, t.TempDir())
	w.note(&datapath.Plan{})
	if w.pending() {
		t.Fatal("a plan that changed nothing made the snapshot dirty")
	}
	w.note(&datapath.Plan{Full: true})
	if !w.pending() {
		t.Fatal("the first full plan did not make the snapshot dirty")
	}
	t0 := time.Unix(1_700_000_000, 0)
	w.flushAt(t0, 0)
	<-w.started
	w.gate <- struct{}{}
	w.wait()
	w.note(&datapath.Plan{Full: true})
	if w.pending() {
		t.Fatal("a full plan that changed nothing made a written snapshot dirty")
	}
}

// A failed write leaves the snapshot dirty (the next flush tries again),
// is counted and logged once, and calls failed after each (the sync loop
// that rested while it ran takes its rest back).
func TestSnapshotWriterRetriesAFailure(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing", "state")
	w := newGatedWriter(t, dir)
	w.save = func(string, *snapshot.Snapshot) error { return errTestDisk }
	var failed atomic.Int32
	w.failed = func() { failed.Add(1) }
	t0 := time.Unix(1_700_000_000, 0)
	for i := range 2 {
		w.note(changedPlan)
		if !w.flushAt(t0.Add(time.Duration(i)*time.Second), time.Hour) {
			t.Fatalf("try %d: no write started", i)
		}
		w.wait()
		if !w.pending() {
			t.Fatalf("try %d: the failed write left nothing pending", i)
		}
	}
	if n := testutil.ToFloat64(w.failures); n != 2 {
		t.Errorf("failures counted %v, want 2", n)
	}
	if n := failed.Load(); n != 2 {
		t.Errorf("failed called %d times, want 2", n)
	}
	if n := strings.Count(w.log.String(), "cannot write the snapshot"); n != 1 {
		t.Errorf("logged %d times, want once:\n%s", n, w.log.String())
	}
	if w.age.Load() != 0 {
		t.Error("a failed write set the snapshot's age")
	}
	// A write that succeeds does not call it.
	w.save = func(dir string, s *snapshot.Snapshot) error { return snapshot.Save(t.TempDir(), s) }
	w.note(changedPlan)
	if !w.flushAt(t0.Add(2*time.Second), time.Hour) {
		t.Fatal("no write started after the failures")
	}
	w.wait()
	if n := failed.Load(); n != 2 {
		t.Errorf("failed called %d times after a good write, want 2", n)
	}
}

// afterWrite runs its function once the running write is done, or at once
// when none runs.
func TestSnapshotWriterAfterWrite(t *testing.T) {
	w := newGatedWriter(t, t.TempDir())
	ran := make(chan struct{}, 2)
	w.afterWrite(func() { ran <- struct{}{} })
	select {
	case <-ran:
	default:
		t.Fatal("with no write running, afterWrite did not run its function at once")
	}
	w.note(changedPlan)
	w.flushAt(time.Unix(1_700_000_000, 0), 0)
	<-w.started
	w.afterWrite(func() { ran <- struct{}{} })
	select {
	case <-ran:
		t.Fatal("afterWrite ran its function while the write ran")
	default:
	}
	w.gate <- struct{}{}
	w.wait()
	select {
	case <-ran:
	default:
		t.Fatal("afterWrite's function did not run once the write was done")
	}
}

var errTestDisk = errors.New("disk full")
