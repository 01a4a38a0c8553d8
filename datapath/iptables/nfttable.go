package iptables

import (
	"golang.org/x/sys/unix"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/nfgen"
)

// nftTable reports whether nf_tables holds table (iptables-nft's "nat"
// or "filter") in fam's family, in the calling thread's network
// namespace (nfgen.Table: one request, a name only). iptables-nft keeps
// its tables there, so without them it holds nothing of ours, and
// CleanupAll need not run it (a start of nftables mode ran it some 50
// times per family to find nothing: about 250 ms of CPU). When it cannot
// tell, it says yes.
func nftTable(fam datapath.Family, table string) bool {
	family := uint8(unix.NFPROTO_IPV4)
	if fam == datapath.IPv6 {
		family = unix.NFPROTO_IPV6
	}
	_, ok, err := nfgen.Table(family, table)
	return ok || err != nil
}
