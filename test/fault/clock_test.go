package fault

import (
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/agent/snapshot"
)

// A clock jump cannot be made on a shared machine, so the suite tests the
// parts that read wall-clock values written before the jump: a snapshot
// whose timestamp is far in the future (the clock was stepped back since)
// or far in the past (stepped forward, or a node that was off for long) is
// still verified and used for an offline start; nothing refuses it by age.
// The timers are monotonic (see docs/reliability.md, "Clock").
func TestSnapshotFromAnotherTime(t *testing.T) {
	for name, written := range map[string]time.Time{
		"future": time.Now().AddDate(10, 0, 0),
		"past":   time.Unix(1, 0),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := snapshot.Save(dir, &snapshot.Snapshot{Written: written}); err != nil {
				t.Fatal(err)
			}
			got, err := snapshot.Load(dir)
			if err != nil {
				t.Fatalf("a snapshot written at %v is refused: %v", written, err)
			}
			if !got.Written.Equal(written) {
				t.Errorf("written = %v, want %v", got.Written, written)
			}
		})
	}
}
