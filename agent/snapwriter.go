package agent

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/snapshot"
	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/policy"
)

// snapshotWriter writes the last known state (agent/snapshot) into the
// state directory after syncs that changed something, at most once per
// interval, beside the sync loop: snapshot.Save encodes every object and
// waits for the disk (about 0.2 s at 5,000 services), and a change that
// arrives meanwhile must not wait for it, nor sync.minPeriod after it.
// One write runs at a time; a plan programmed meanwhile leaves the snapshot
// dirty for a later flush. Its methods may be called from any goroutine.
type snapshotWriter struct {
	dir      string
	log      *slog.Logger
	failures prometheus.Counter
	// age holds the written stamp (Unix ns) of the snapshot on disk, 0
	// when none is known: the agent's, as a start from the snapshot sets
	// it too.
	age *atomic.Int64
	// save is snapshot.Save; a test's may block.
	save func(dir string, s *snapshot.Snapshot) error
	// gc collects after a write that left the heap near its trigger
	// (betweenSyncs); nil: never.
	gc *betweenSyncs
	// failed is called after a write failed (the sync loop's Unrest): a
	// loop that rested while the write ran would not retry it for an
	// hour; nil: nothing.
	failed func()
	wg     sync.WaitGroup

	mu      sync.Mutex
	written time.Time // the stamp of the last successful write
	dirty   bool      // a programmed plan is not on disk yet
	writing bool      // a write runs
	failing bool      // the last write failed
	then    func()    // runs once the running write ends (afterWrite)
}

func newSnapshotWriter(dir string, log *slog.Logger, failures prometheus.Counter, age *atomic.Int64) *snapshotWriter {
	return &snapshotWriter{dir: dir, log: log, failures: failures, age: age, save: snapshot.Save}
}

// note records a programmed plan: one that changed service ports, or the
// first full one while nothing was written yet, makes the snapshot dirty.
func (w *snapshotWriter) note(p *datapath.Plan) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(p.Changed) > 0 || p.Full && w.written.IsZero() {
		w.dirty = true
	}
}

// pending reports whether a programmed plan waits to be written.
func (w *snapshotWriter) pending() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.dirty
}

// flush starts a write of build's snapshot, stamped now, when the snapshot
// is dirty, no write runs, and interval has passed since the last good
// one; otherwise the snapshot stays dirty for a later flush. build runs
// only then, in the caller's goroutine. A failed write leaves it dirty:
// every later flush tries again.
func (w *snapshotWriter) flush(now time.Time, interval time.Duration, build func(now time.Time) *snapshot.Snapshot) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.dirty || w.writing || now.Sub(w.written) < interval {
		return
	}
	s := build(now)
	w.writing, w.dirty = true, false
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		m := w.gc.mark()
		err := w.save(w.dir, s)
		written := s.Written
		s = nil // garbage before w.then (releaseAfterStart)
		w.mu.Lock()
		w.writing = false
		ok := w.wroteLocked(written, err)
		if !ok {
			w.dirty = true
		}
		then := w.then
		w.then = nil
		w.mu.Unlock()
		if !ok && w.failed != nil {
			w.failed()
		}
		if then != nil {
			then()
		}
		w.gc.afterWrite(m)
	}()
}

// write saves s now, in the caller's goroutine, and reports whether it
// was written.
func (w *snapshotWriter) write(s *snapshot.Snapshot) bool {
	err := w.save(w.dir, s)
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.wroteLocked(s.Written, err)
}

// afterWrite runs fn once the running write ends, or now when none runs.
func (w *snapshotWriter) afterWrite(fn func()) {
	w.mu.Lock()
	if w.writing {
		w.then = fn
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	fn()
}

// wait returns once no write runs.
func (w *snapshotWriter) wait() { w.wg.Wait() }

// wroteLocked records the outcome of a write of the snapshot stamped
// written. A failure (a full disk, a read-only directory) keeps the
// previous snapshot, is counted in edgeproxy_snapshot_write_failures_total
// and logged once until a write succeeds again. Called with w.mu held.
func (w *snapshotWriter) wroteLocked(written time.Time, err error) bool {
	if err != nil {
		w.failures.Inc()
		if why := policy.DirProblem(w.dir); why != nil {
			err = fmt.Errorf("%w: %w", err, why)
		}
		if !w.failing {
			w.log.Warn("cannot write the snapshot; the previous one stays, retrying on every sync", "dir", w.dir, "err", err)
		}
		w.failing = true
		return false
	}
	if w.failing {
		w.log.Info("the snapshot is written again", "dir", w.dir)
	}
	w.failing = false
	w.written = written
	w.age.Store(written.UnixNano())
	return true
}
