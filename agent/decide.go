package agent

// A syncKind is what one sync does, chosen by decide. The sync.period
// compare renders every service again and writes what differs: the guard
// against a change that the partial syncs missed.
type syncKind uint8

const (
	// syncIdle: nothing moved and no compare is due; the last plan
	// stands, nothing is planned or applied.
	syncIdle syncKind = iota
	// syncRest: nothing moved, and the due compare would compare nothing
	// (the state and the kernel are as the last compare left them): it
	// counts as done, and the loop may rest until something moves.
	syncRest
	// syncPartial: plan the changed service ports and apply them.
	syncPartial
	// syncPartialQuiet: as syncPartial (something beside the state asks
	// for a plan), and the due compare counts as done, as in syncRest.
	syncPartialQuiet
	// syncPartialFirst: as syncPartial; the compare that came due waits
	// for the next sync, so that the changes do not wait for it.
	syncPartialFirst
	// syncFull: a full sync is owed (the first one, or after a failed
	// apply, tampering or a reload): the plan compares everything.
	syncFull
	// syncCompare: the sync.period compare: the plan compares everything.
	syncCompare
)

var syncKindNames = [...]string{"idle", "rest", "partial", "partial (compare quiet)", "partial (compare next)", "full", "compare"}

func (k syncKind) String() string {
	if int(k) < len(syncKindNames) {
		return syncKindNames[k]
	}
	return "syncKind(?)"
}

// plans reports whether a sync of this kind plans and applies.
func (k syncKind) plans() bool { return k != syncIdle && k != syncRest }

// full reports whether its plan compares everything (datapath.Plan.Full).
func (k syncKind) full() bool { return k == syncFull || k == syncCompare }

// quietCompare reports whether the due compare counts as done without
// running.
func (k syncKind) quietCompare() bool { return k == syncRest || k == syncPartialQuiet }

// syncInput is what a sync's decision turns on, read under the sync lock.
type syncInput struct {
	// changed: the snapshot carries changes (service ports or the node).
	changed bool
	// generation is the snapshot's; synced that of the last successful
	// apply, compared that of the last compare.
	generation, synced, compared uint64
	// owed: a full sync is owed (Agent.needFull).
	owed bool
	// unsettled: something beside the state asks for a plan: the
	// planner's cache, probe verdicts in force or wanted, a start or end of
	// serving from the snapshot, IPVS real servers draining.
	unsettled bool
	// compareDue: sync.period has passed since the last compare.
	compareDue bool
	// deferred: the due compare already waited for one sync.
	deferred bool
	// vouched: the backend vouches that its kernel objects are as its
	// last apply left them (kernelWatch); asked only when a compare is due.
	vouched bool
}

// decide chooses what a sync does. It is pure: the table in
// decide_test.go names every situation.
//
// The compare runs only when something it guards may have moved since the
// last one: the state (a newer generation) or the kernel (the backend
// cannot vouch for its objects); otherwise it counts as done, and a sync
// with nothing else to do rests (restWhenQuiet) instead of waking every
// period.
//
// A compare that comes due while changes wait is left to the next sync
// (once): the changes are applied partially first, and no sync is asked
// for on the compare's account: a compare sync right after the partial one
// would hold the next change for as long as it runs plus sync.minPeriod.
// The next change's sync (which compares then: with the iptables datapath
// a hash per unit) or the runner's periodic one takes it; a compare that
// carries changes applies them on their own first (Agent.sync), so no
// change waits for a compare.
func decide(in syncInput) syncKind {
	moved := in.changed || in.generation != in.synced
	idle := !moved && !in.owed && !in.unsettled
	switch {
	case in.owed:
		return syncFull
	case !in.compareDue && idle:
		return syncIdle
	case !in.compareDue:
		return syncPartial
	case moved && !in.deferred:
		return syncPartialFirst
	case in.vouched && in.generation == in.compared && idle:
		return syncRest
	case in.vouched && in.generation == in.compared:
		return syncPartialQuiet
	}
	return syncCompare
}
