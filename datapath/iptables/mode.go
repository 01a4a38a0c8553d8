package iptables

// A syncMode is what one family's apply does, chosen by decideMode. A
// partial sync trusts plan.Changed; a compare trusts nothing the plan says
// about changes but only the hashes of what was written; a rewrite trusts
// nothing and writes everything.
type syncMode uint8

const (
	// modePartial renders the service ports plan.Changed names (the
	// others are taken as written) and writes the chains that differ.
	modePartial syncMode = iota
	// modeCompare renders every unit whose input moved since it was
	// written and writes the chains that differ (plan.Full on a family
	// with nothing owed).
	modeCompare
	// modeRewrite renders and writes every chain and deletes ours the
	// plan does not want: the first apply, after a failure or tampering,
	// and once per FullSyncPeriod.
	modeRewrite
)

var syncModeNames = [...]string{"partial", "compare", "rewrite"}

func (m syncMode) String() string {
	if int(m) < len(syncModeNames) {
		return syncModeNames[m]
	}
	return "syncMode(?)"
}

// modeInput is what a family's mode turns on.
type modeInput struct {
	applied    bool // a plan was applied since start
	owed       bool // the last apply failed or tampering was seen (family.needFull)
	rewriteDue bool // FullSyncPeriod has passed since the last rewrite
	compare    bool // the plan compares everything (plan.Full)
}

// decideMode chooses what one family's apply does. kernelMoved is asked
// only when the answer would be a compare, since it may cost a tamper
// check: a kernel that may have been written by someone else (the check
// failed or found a change) turns the compare into a rewrite.
func decideMode(in modeInput, kernelMoved func() bool) syncMode {
	switch {
	case !in.applied || in.owed || in.rewriteDue:
		return modeRewrite
	case !in.compare:
		return modePartial
	case kernelMoved():
		return modeRewrite
	}
	return modeCompare
}
