package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/edgeproxy/edgeproxy/agent/planner"
	"github.com/edgeproxy/edgeproxy/agent/snapshot"
	"github.com/edgeproxy/edgeproxy/policy"
)

// saveSnapshot writes the last known state after a sync that changed
// something, at most once per offline.snapshotInterval. A skipped write is
// remembered and done by a later sync, an idle one included. Called with
// a.mu held.
//
// The write runs beside the sync loop: snapshot.Save encodes every object
// and waits for the disk (about 0.2 s at 5,000 services), and a change
// that arrives meanwhile must not wait for it, nor sync.minPeriod after
// it. One write runs at a time; a sync while it runs leaves the snapshot
// dirty for a later one. Run waits for it before it returns.
func (a *Agent) saveSnapshot(res *planner.Result, now time.Time) {
	if a.api == nil || a.Config().StateDir == "" {
		return // a manifest directory is its own last known state
	}
	if len(res.Plan.Changed) > 0 || res.Plan.Full && a.snapWritten.IsZero() {
		a.snapDirty = true
	}
	if !a.snapDirty || a.snapWriting || now.Sub(a.snapWritten) < a.Config().Offline.SnapshotInterval {
		return
	}
	node, services, slices := a.state.Objects()
	s := &snapshot.Snapshot{Written: now, Services: services, Slices: slices, Plan: *res.Plan}
	if node != nil {
		s.Node = *node
	}
	if a.chains != nil {
		s.Modules = map[string]string{}
		for _, m := range a.chains.Modules() {
			s.Modules[m.Module] = m.SHA256
		}
	}
	a.snapWriting, a.snapDirty = true, false
	dir := a.Config().StateDir
	a.snapWG.Add(1)
	go func() {
		defer a.snapWG.Done()
		err := snapshot.Save(dir, s)
		written := s.Written
		s = nil // garbage before releaseAfterStart
		a.mu.Lock()
		a.snapWriting = false
		if !a.wroteSnapshot(dir, written, err) {
			a.snapDirty = true // tried again by the next sync
		}
		release := a.releaseAfterSnap
		a.releaseAfterSnap = false
		a.mu.Unlock()
		if release {
			releaseAfterStart(a.log)
		}
	}()
}

// writeSnapshot saves s to the state directory now. Called with a.mu held.
func (a *Agent) writeSnapshot(s *snapshot.Snapshot) bool {
	dir := a.Config().StateDir
	return a.wroteSnapshot(dir, s.Written, snapshot.Save(dir, s))
}

// wroteSnapshot records the outcome of a write of the snapshot stamped
// written. A failure (a full disk, a read-only directory) keeps the previous
// snapshot, is counted in edgeproxy_snapshot_write_failures_total and logged
// once until a write succeeds again: the caller keeps the snapshot dirty, so
// every later sync tries again. Called with a.mu held.
func (a *Agent) wroteSnapshot(dir string, written time.Time, err error) bool {
	if err != nil {
		a.metrics.snapshotWriteFailures.Inc()
		if why := policy.DirProblem(dir); why != nil {
			err = fmt.Errorf("%w: %w", err, why)
		}
		if !a.snapFailing {
			a.log.Warn("cannot write the snapshot; the previous one stays, retrying on every sync", "dir", dir, "err", err)
		}
		a.snapFailing = true
		return false
	}
	if a.snapFailing {
		a.log.Info("the snapshot is written again", "dir", dir)
	}
	a.snapFailing = false
	a.snapWritten = written
	a.snapAge.Store(written.UnixNano())
	return true
}

// startFromSnapshot loads the on-disk snapshot into the state, so the sync
// loop programs the last known state while the API server is unreachable
// (or not yet listed after a reboot); why says which, for the log.
// A missing, corrupt or incompatible snapshot is refused whole.
func (a *Agent) startFromSnapshot(why string) bool {
	dir := a.Config().StateDir
	s, err := snapshot.Load(dir)
	switch {
	case errors.Is(err, snapshot.ErrNotFound):
		a.log.Warn(why+" and there is no snapshot yet; waiting for the API server", "dir", dir)
		return false
	case err != nil:
		a.log.Error(why+" and the snapshot is refused; waiting for the API server", "dir", dir, "err", err)
		return false
	}
	a.log.Warn(why+"; programming the last known state",
		"written", s.Written.Format(time.RFC3339), "services", len(s.Services), "slices", len(s.Slices), "frontends", len(s.Plan.Frontends))
	for i := range s.Services {
		svc := &s.Services[i]
		a.state.SetService(svc.Namespace+"/"+svc.Name, svc)
	}
	for i := range s.Slices {
		sl := &s.Slices[i]
		a.state.SetSlice(sl.Namespace+"/"+sl.Name, sl)
	}
	if s.Node.Name != "" {
		n := s.Node
		a.state.SetNode(&n)
	}
	a.snapAge.Store(s.Written.UnixNano())
	a.fromSnapshot.Store(true)
	return true
}

// reconcileAfterOffline runs once the API source has listed everything
// after a start from the snapshot: objects the API no longer has are
// removed, and the runner makes one coalesced sync of the differences.
func (a *Agent) reconcileAfterOffline(ctx context.Context) {
	if !a.source.WaitForSync(ctx) {
		return
	}
	services, slices := a.api.Keys()
	removed := a.state.Retain(services, slices)
	a.fromSnapshot.Store(false)
	a.log.Info("the API server is back; converging from the snapshot", "removed", removed)
	a.runner.Run()
}

func (a *Agent) snapshotAgeSeconds() float64 {
	n := a.snapAge.Load()
	if n == 0 {
		return -1
	}
	// A wall-clock age: the snapshot may come from before a restart. A
	// clock stepped back makes it look written in the future; say 0, not
	// a negative age.
	return max(0, time.Since(time.Unix(0, n)).Seconds())
}
