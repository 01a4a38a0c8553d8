package source

import (
	"strings"
	"testing"
	"time"
)

// The last contact with the API server carries Go's monotonic clock, so
// the heartbeat's "quiet for quietAfter" and the contact-age metric are
// not fooled by a wall clock stepped back (the API server would look heard
// from in the future and the heartbeat would stop probing for as long as
// the step) or forward. time.Time.String shows the monotonic reading as
// "m=±..."; a time rebuilt from Unix nanoseconds has none.
func TestLastContactIsMonotonic(t *testing.T) {
	a := &API{born: time.Now()}
	if !a.LastContact().IsZero() {
		t.Fatal("a contact before any event")
	}
	a.touch()
	got := a.LastContact()
	if !strings.Contains(got.String(), " m=") {
		t.Errorf("LastContact() = %s has no monotonic reading", got)
	}
	if d := time.Since(got); d < 0 || d > time.Minute {
		t.Errorf("time since the contact = %v", d)
	}
}

// A quiet heartbeat wakes on the 10-second grid the tamper monitor uses,
// never before the wait it was given.
func TestHeartbeatOnGrid(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct{ now, d, want time.Duration }{
		{0, 10 * time.Second, 10 * time.Second},
		{3 * time.Second, 10 * time.Second, 17 * time.Second},
		{10*time.Second + time.Millisecond, 10 * time.Second, 20*time.Second - time.Millisecond},
	} {
		if got := onGrid(base.Add(tc.now), tc.d); got != tc.want {
			t.Errorf("onGrid(+%v, %v) = %v, want %v", tc.now, tc.d, got, tc.want)
		}
	}
}
