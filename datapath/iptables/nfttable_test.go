package iptables

import (
	"testing"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/xtables"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// nftTable finds iptables-nft's tables by name and family, so that
// CleanupAll runs iptables-nft only where it may hold something.
func TestNFTTable(t *testing.T) {
	gate.Root(t)
	gate.Binaries(t, "nft")
	ns := netns.New(t, "iptnfttable")
	has := func(fam datapath.Family, table string) bool {
		var ok bool
		if err := ns.Do(func() error { ok = nftTable(fam, table); return nil }); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	for _, fam := range []datapath.Family{datapath.IPv4, datapath.IPv6} {
		for _, tb := range []string{xtables.NAT, xtables.Filter} {
			if has(fam, tb) {
				t.Fatalf("an empty namespace holds IPv%d %s", fam, tb)
			}
		}
	}
	// Another program's table of another name is not iptables-nft's.
	if _, err := ns.Run("nft", "add table ip nat; add table ip6 filter; add table inet other"); err != nil {
		t.Fatal(err)
	}
	want := map[datapath.Family]map[string]bool{
		datapath.IPv4: {xtables.NAT: true, xtables.Filter: false},
		datapath.IPv6: {xtables.NAT: false, xtables.Filter: true},
	}
	for fam, tables := range want {
		for tb, w := range tables {
			if got := has(fam, tb); got != w {
				t.Errorf("IPv%d %s: %v, want %v", fam, tb, got, w)
			}
		}
	}
}
