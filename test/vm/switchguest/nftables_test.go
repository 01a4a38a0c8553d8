package switchguest

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/internal/testkit/switchload"
	"github.com/edgeproxy/edgeproxy/test/proxies"
)

// TestSwitchNFTablesIPVSGuest switches a live node between edgeproxy's
// nftables and IPVS modes, as a user does (stop, start with the other
// mode's configuration: the mode is read at start only), nftables → IPVS
// → nftables, under switchload's stream of new connections to web and
// established flows to steady; while no proxy runs, pod c leaves web.
// Entering either mode, the agent removes the other's objects after its
// first sync, so the old rules answer until the new ones are in.
//
// Per switch, once the status reports the takeover (the first sync done
// and the old mode's objects gone): nothing of the old mode is left (`nft
// list tables`; EP- chains, edgeproxy0, EP- ipsets, virtual servers), the
// user's virtual server stays, and 0 new connections failed and 0 reached
// the deleted endpoint. Flows established under nftables mode carry their
// NAT in conntrack and must all survive into IPVS mode; those established
// through IPVS's virtual servers have none of their own and lose their
// way when the virtual servers and edgeproxy0's addresses go (as in
// TestSwitchKubeProxyIPVSGuest's switch to iptables mode): counted, not
// held.
func TestSwitchNFTablesIPVSGuest(t *testing.T) {
	w := newWorld(t, proxies.ModeNFTables, proxies.ModeIPVS)
	gate.Binaries(t, "nft")
	t.Logf("world ready in %s", time.Since(w.start).Round(100*time.Millisecond))

	began := time.Now()
	cur := w.startProxy(proxies.EdgeProxy, proxies.ModeNFTables)
	w.synced(proxies.EdgeProxy, proxies.ModeNFTables, cur)
	t.Logf("edgeproxy nftables synced %s after its start", time.Since(began).Round(100*time.Millisecond))
	w.reaches(WebVIP, "c")
	var report []string
	srcPorts := switchload.NewSourcePorts(PodPort, HeldPort)
	prev := proxies.ModeNFTables
	for i, next := range []string{proxies.ModeIPVS, proxies.ModeNFTables} {
		what := fmt.Sprintf("edgeproxy %s → %s", prev, next)
		began := time.Now()
		sw := switchload.Start(t, w.client, srcPorts, WebVIP, SteadyVIP, HeldPort)
		sw.WaitNew(20)
		cur.Stop()
		w.host("delete", "c")
		sw.Deleted()
		started := time.Now()
		p := w.startProxy(proxies.EdgeProxy, next)
		w.synced(proxies.EdgeProxy, next, p)
		phases := fmt.Sprintf("pod c deleted in %s, edgeproxy %s synced %s after its start",
			started.Sub(began).Round(100*time.Millisecond), next, time.Since(started).Round(100*time.Millisecond))
		logPhases(t, what, p.Log)
		tables := nftTables(t, w.node)
		switch next {
		case proxies.ModeIPVS:
			for _, l := range tables {
				// The main table or a service table (edgeproxy-svc-N).
				if strings.HasSuffix(l, " edgeproxy") || strings.Contains(l, " edgeproxy-") {
					t.Errorf("%s: nftables mode's table left: %s", what, l)
				}
			}
			k := readKernel(t, w.node)
			ours := map[netip.Addr]bool{}
			for _, a := range k.links["edgeproxy0"] {
				ours[a] = true
			}
			if !ours[WebVIP] || !ours[SteadyVIP] {
				t.Errorf("%s: edgeproxy0 holds %v, want %s and %s", what, k.links["edgeproxy0"], WebVIP, SteadyVIP)
			}
		case proxies.ModeNFTables:
			if !containsLine(tables, "table ip edgeproxy") {
				t.Errorf("%s: no table ip edgeproxy in %q", what, tables)
			}
			assertNoIPVSMode(t, w.node, what)
		}
		assertUserVS(t, w.node)
		sw.Switched()
		sw.WaitNew(100)
		sw.WaitExchanges(5 * (switchload.HeldFlows + switchload.UDPFlows))
		res := sw.Stop()
		report = append(report, fmt.Sprintf("%s: %s", what, res))
		t.Logf("%s: %s; %s in all; kernel after: %s", what, phases, time.Since(began).Round(100*time.Millisecond), kernelSummary(t, w.node))
		judge(t, what, res, prev == proxies.ModeNFTables, "nftables mode does not carry IPVS's connections over")
		cur, prev = p, next
		if i == 0 { // c serves again for the next switch
			w.host("add", "c")
			w.reaches(WebVIP, "c")
		}
	}
	t.Logf("nftables ⇄ IPVS switch summary (%s):\n  %s", time.Since(w.start).Round(time.Second), strings.Join(report, "\n  "))
}

// nftTables lists the node's nf_tables tables (`nft list tables`), one
// "table <family> <name>" a line.
func nftTables(t *testing.T, node *netns.Node) []string {
	t.Helper()
	out, err := node.Run("nft", "list", "tables")
	if err != nil {
		t.Fatalf("nft list tables: %v: %s", err, out)
	}
	var tables []string
	for _, l := range strings.Split(out, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			tables = append(tables, l)
		}
	}
	return tables
}

func containsLine(lines []string, want string) bool {
	for _, l := range lines {
		if l == want {
			return true
		}
	}
	return false
}

// assertNoIPVSMode fails t if anything of edgeproxy's IPVS mode is left
// in the node: an EP- chain or rule (either backend), edgeproxy0, an EP-
// ipset, or a virtual server but the user's.
func assertNoIPVSMode(t *testing.T, node *netns.Node, what string) {
	t.Helper()
	for _, save := range []string{"iptables-nft-save", "iptables-legacy-save"} {
		out, err := node.Run(save)
		if err != nil {
			t.Fatal(err)
		}
		if edgeProxyChain.MatchString(out) {
			t.Errorf("%s: %s: IPVS mode's rules left:\n%s", what, save, out)
		}
	}
	k := readKernel(t, node)
	if as, ok := k.links["edgeproxy0"]; ok {
		t.Errorf("%s: edgeproxy0 left, with %v", what, as)
	}
	for _, s := range k.sets {
		if strings.HasPrefix(s, "EP-") {
			t.Errorf("%s: IPVS mode's ipset %s left", what, s)
		}
	}
	for _, v := range k.servers {
		if v.Key() != userVS.Key() {
			t.Errorf("%s: virtual server %s left: not the user's", what, v)
		}
	}
}
