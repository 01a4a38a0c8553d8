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
