package netns

import (
	"testing"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
)

// A slot another node holds is passed over: two links that start from
// the same slot (as two test binaries can) both come up, on different
// addresses.
func TestLinkHostPassesOverTakenSlot(t *testing.T) {
	gate.Root(t)
	a, b := NewNode(t, "lha"), NewNode(t, "lhb")
	ha, _ := a.LinkHost()
	seq.Add(-1) // b starts from the slot a holds
	hb, _ := b.LinkHost()
	if ha == hb {
		t.Fatalf("both links on %s", ha)
	}
}
