package agent

import "testing"

// Every situation a sync can meet, and what it does about it.
func TestDecide(t *testing.T) {
	// steady: the last apply carried generation 7, which the last compare
	// compared too; nothing waits.
	steady := syncInput{generation: 7, synced: 7, compared: 7}
	with := func(f func(*syncInput)) syncInput { in := steady; f(&in); return in }
	tests := []struct {
		name string
		in   syncInput
		want syncKind
	}{
		{"nothing moved, no compare due", steady, syncIdle},
		{"service ports changed", with(func(in *syncInput) { in.changed, in.generation = true, 8 }), syncPartial},
		{"a newer generation without changes", with(func(in *syncInput) { in.generation = 8 }), syncPartial},
		{"the planner's cache or probe verdicts ask for a plan", with(func(in *syncInput) { in.unsettled = true }), syncPartial},
		{"a full sync is owed", with(func(in *syncInput) { in.owed = true }), syncFull},
		{"a full sync is owed while changes wait", with(func(in *syncInput) { in.owed, in.changed, in.generation = true, true, 8 }), syncFull},
		{"a full sync is owed when a compare is due too", with(func(in *syncInput) { in.owed, in.compareDue, in.vouched = true, true, true }), syncFull},
		{"compare due, kernel and state as compared", with(func(in *syncInput) { in.compareDue, in.vouched = true, true }), syncRest},
		{"compare due, kernel vouched, a plan asked for beside the state", with(func(in *syncInput) { in.compareDue, in.vouched, in.unsettled = true, true, true }), syncPartialQuiet},
		{"compare due, the kernel cannot vouch", with(func(in *syncInput) { in.compareDue = true }), syncCompare},
		{"compare due, state moved since the last compare", with(func(in *syncInput) { in.compareDue, in.vouched, in.synced = true, true, 8; in.generation = 8 }), syncCompare},
		{"compare due while changes wait", with(func(in *syncInput) { in.compareDue, in.vouched, in.changed, in.generation = true, true, true, 8 }), syncPartialFirst},
		{"compare due while changes wait, already deferred once", with(func(in *syncInput) { in.compareDue, in.changed, in.generation, in.deferred = true, true, 8, true }), syncCompare},
		{"compare deferred once, nothing moved since, kernel vouches", with(func(in *syncInput) { in.compareDue, in.deferred, in.vouched = true, true, true }), syncRest},
		{"deferred, but no compare due (it ran)", with(func(in *syncInput) { in.deferred = true }), syncIdle},
	}
	for _, tt := range tests {
		if got := decide(tt.in); got != tt.want {
			t.Errorf("%s: %+v: decide = %v, want %v", tt.name, tt.in, got, tt.want)
		}
	}
}
