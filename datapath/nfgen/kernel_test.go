package nfgen_test

import (
	"testing"

	"github.com/edgeproxy/edgeproxy/datapath/nfgen"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// Current reads the generation of the calling thread's namespace: it
// stays put while nothing is committed there and moves with each commit,
// here two nft transactions.
func TestCurrentFollowsCommits(t *testing.T) {
	gate.Root(t)
	gate.Binaries(t, "nft")
	ns := netns.New(t, "nfgen")
	read := func() uint32 {
		t.Helper()
		var g uint32
		if err := ns.Do(func() (err error) { g, err = nfgen.Current(); return err }); err != nil {
			t.Fatal(err)
		}
		return g
	}
	g0 := read()
	if g := read(); g != g0 {
		t.Fatalf("generation moved from %d to %d with no commit", g0, g)
	}
	for i, cmd := range [][]string{{"add", "table", "ip", "nfgen"}, {"add", "chain", "ip", "nfgen", "c"}} {
		if _, err := ns.Run("nft", cmd...); err != nil {
			t.Fatal(err)
		}
		if g := read(); g != g0+uint32(i)+1 {
			t.Fatalf("after %q: generation %d, want %d", cmd, g, g0+uint32(i)+1)
		}
	}
}
