package nfgen_test

import (
	"testing"

	"golang.org/x/sys/unix"

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

// Table finds a table by family and name, with its use count: absent at
// first, then present in its own family only, counting what it holds.
func TestTable(t *testing.T) {
	gate.Root(t)
	gate.Binaries(t, "nft")
	ns := netns.New(t, "nfgentable")
	table := func(family uint8) (uint32, bool) {
		t.Helper()
		var use uint32
		var ok bool
		if err := ns.Do(func() (err error) { use, ok, err = nfgen.Table(family, "nfgen"); return err }); err != nil {
			t.Fatal(err)
		}
		return use, ok
	}
	if _, ok := table(unix.NFPROTO_IPV4); ok {
		t.Fatal("an empty namespace holds ip nfgen")
	}
	if _, err := ns.Run("nft", "add table ip nfgen; add chain ip nfgen a; add chain ip nfgen b; add set ip nfgen s { type ipv4_addr; }"); err != nil {
		t.Fatal(err)
	}
	if use, ok := table(unix.NFPROTO_IPV4); !ok || use != 3 {
		t.Fatalf("ip nfgen: use %d, found %v; want 3 (two chains, a set), found", use, ok)
	}
	if _, ok := table(unix.NFPROTO_IPV6); ok {
		t.Fatal("ip6 nfgen found: only ip nfgen exists")
	}
}
