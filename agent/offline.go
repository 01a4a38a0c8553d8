package agent

import (
	"context"
	"errors"
	"time"

	"github.com/edgeproxy/edgeproxy/agent/planner"
	"github.com/edgeproxy/edgeproxy/agent/snapshot"
)

// saveSnapshot hands a programmed plan to the snapshot writer, which
// writes the last known state after a sync that changed something, at most
// once per offline.snapshotInterval, beside the sync loop; a skipped write
// is done by a later sync, an idle one included. Called with a.mu held.
func (a *Agent) saveSnapshot(res *planner.Result, now time.Time) {
	if a.api == nil || a.Config().StateDir == "" {
		return // a manifest directory is its own last known state
	}
	a.snaps.note(res.Plan)
	a.flushSnapshot(res, now)
}

// flushSnapshot starts the write that the interval put off, if any, of
// the state with res, the plan last programmed. Called with a.mu held, so
// that the objects are those of res.
func (a *Agent) flushSnapshot(res *planner.Result, now time.Time) {
	a.snaps.flush(now, a.Config().Offline.SnapshotInterval, func(now time.Time) *snapshot.Snapshot {
		// The resume points first: the objects read after them hold
		// every event up to them.
		resume := a.api.ResumePoints()
		node, services, slices := a.state.Objects()
		s := &snapshot.Snapshot{Written: now, Services: services, Slices: slices, Plan: *res.Plan, Resume: resume}
		if node != nil {
			s.Node = *node
		}
		if a.chains != nil {
			s.Modules = map[string]string{}
			for _, m := range a.chains.Modules() {
				s.Modules[m.Module] = m.SHA256
			}
		}
		return s
	})
}

// writeSnapshot saves s to the state directory now.
func (a *Agent) writeSnapshot(s *snapshot.Snapshot) bool { return a.snaps.write(s) }

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
	if !a.resumeAsked {
		a.loaded = s // for resumeFromSnapshot, which forgets it
	}
	return true
}

// resumeFromSnapshot makes the API informers start from the snapshot's
// resume points, if it has any, instead of listing: a restart within the
// API server's watch-cache window then costs a watch from where the
// snapshot was, not a full read (RATIONALE.md, "Why a restart resumes
// from the snapshot"). Called before the source runs.
func (a *Agent) resumeFromSnapshot() {
	dir := a.Config().StateDir
	if a.api == nil || dir == "" {
		return
	}
	s := a.loaded
	a.loaded, a.resumeAsked = nil, true
	if s == nil {
		var err error
		if s, err = snapshot.Load(dir); err != nil {
			return // startFromSnapshot says why, if it comes to that
		}
	}
	if n := a.api.Resume(s.Resume, s.Services, s.Slices); n > 0 {
		a.log.Info("resuming the API watches from the snapshot", "informers", n, "written", s.Written.Format(time.RFC3339))
	}
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
