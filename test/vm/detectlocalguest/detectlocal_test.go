package detectlocalguest

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/internal/testkit/poll"
	"github.com/edgeproxy/edgeproxy/internal/testkit/vm"
	"github.com/edgeproxy/edgeproxy/test/proxies"
)

var (
	sharedDir = flag.String("detect.dir", "", "run TestDetectLocalIPVSGuest with the host's world in this directory")
	only      = flag.String("detect.settings", "", "comma-separated names of the settings to run (default all)")
)

// setting is one local-traffic detection setting of both proxies.
type setting struct {
	name string
	s    proxies.Settings
	// masqClusterIP is kube-proxy's anchor: which sources (froms order)
	// it masquerades to the ClusterIP, in both families and both
	// protocols. Every NodePort probe is masqueraded
	// (externalTrafficPolicy Cluster).
	masqClusterIP [5]bool
}

// TestDetectLocalIPVSGuest: for each local-traffic detection setting —
// kube-proxy's four --detect-local-mode values, --masquerade-all, and no
// --cluster-cidr — kube-proxy --proxy-mode=ipvs and then edgeproxy mode
// ipvs run in one dual-stack node, one after the other (the node's rules,
// virtual servers, dummy links, ipsets and conntrack table emptied
// between, and the conntrack table checked empty), and the same probes go
// to a ClusterIP and a NodePort, TCP and UDP, in both families, from a pod
// in this node's range, a pod on the bridge in another node's range, a pod
// in no range, the outside client and the node itself. A probe's outcome
// is the source address the endpoint saw (kept or masqueraded), or no
// answer; edgeproxy's must be kube-proxy's for every probe. kube-proxy's
// column is anchored on what its settings mean in IPVS mode, so that a
// world in which detection never mattered fails instead of matching
// itself.
func TestDetectLocalIPVSGuest(t *testing.T) {
	vm.Guest(t)
	gate.Root(t)
	if *sharedDir == "" {
		t.Skip("started by test/vm's TestDetectLocalIPVS, with -detect.dir")
	}
	gate.Binaries(t, "iptables-nft", "iptables-nft-save", "ipset", "conntrack", "nft")
	raw, err := os.ReadFile(filepath.Join(*sharedDir, "setup.json"))
	if err != nil {
		t.Fatal(err)
	}
	var setup Setup
	if err := json.Unmarshal(raw, &setup); err != nil {
		t.Fatalf("setup.json: %v", err)
	}
	start := time.Now()

	node := netns.NewNode(t, "node")
	a, b := node.AddPod("a"), node.AddPod("b")
	if b.IP != BIPs[0] || b.IP6 != BIPs[1] {
		t.Fatalf("pod b has %s and %s, the host made it %s", b.IP, b.IP6, BIPs)
	}
	other := node.AddPodAddrs("other", netip.MustParseAddr("10.244.1.9"), netip.MustParseAddr("fd00:244:1::9"))
	stray := node.AddPodAddrs("stray", netip.MustParseAddr("172.16.0.9"), netip.MustParseAddr("fd00:16::9"))
	client := node.AddClient("client")
	if node.LinkIP != NodeIP || node.LinkIP6 != NodeIP6 {
		t.Fatalf("node link %s and %s, the host's Node says %s and %s", node.LinkIP, node.LinkIP6, NodeIP, NodeIP6)
	}
	if err := b.Serve(PodPort); err != nil {
		t.Fatal(err)
	}
	vm.RelayToHost(t, node.NS, setup.APIPort)

	dir := t.TempDir()
	path, err := proxies.BackendPath(dir, "nft")
	if err != nil {
		t.Fatal(err)
	}
	pn := proxies.Node{Name: NodeName, Kubeconfig: filepath.Join(*sharedDir, "kubeconfig"), MetricsAddr: "127.0.0.1:10249", HealthzAddr: "0.0.0.0:10256"}
	t.Cleanup(func() {
		if t.Failed() {
			for _, cmd := range [][]string{{"iptables-nft-save", "-t", "nat"}, {"ip6tables-nft-save", "-t", "nat"}, {"ipvsadm", "-Ln"}, {"ip", "addr"}} {
				out, _ := node.Run(cmd[0], cmd[1:]...)
				t.Logf("%s in the node:\n%s", strings.Join(cmd, " "), out)
			}
		}
	})

	froms := []struct {
		name      string
		ns        *netns.NS
		src, src6 netip.Addr // its addresses, as b sees them when not masqueraded
	}{
		{"node-range pod", a.NS, a.IP, a.IP6},
		{"other-range pod", other.NS, other.IP, other.IP6},
		{"stray pod", stray.NS, stray.IP, stray.IP6},
		{"outside client", client, netip.MustParseAddr("192.168.77.2"), netip.MustParseAddr("fd00:77::2")},
		{"node", node.NS, node.LinkIP, node.LinkIP6},
	}
	// What b sees of a masqueraded connection is the bridge's address.
	dsts := []struct {
		name     string
		addr     netip.AddrPort
		nodePort bool
		masq     netip.Addr
	}{
		{"ClusterIP", netip.AddrPortFrom(VIP, 80), false, node.Gateway},
		{"NodePort", netip.AddrPortFrom(node.LinkIP, NodePort), true, node.Gateway},
		{"ClusterIP6", netip.AddrPortFrom(VIP6, 80), false, node.Gateway6},
		{"NodePort6", netip.AddrPortFrom(node.LinkIP6, NodePort), true, node.Gateway6},
	}
	protos := []string{"tcp", "udp"}
	at := func(p, d, f int) int { return (p*len(dsts)+d)*len(froms) + f }

	// Every probe has a source port of its own for the whole run (TCP
	// 11000-31999: below the ephemeral range the proxies' own
	// connections take, above their 10249 and 10256; UDP 40000-60999: no
	// UDP socket is bound in these namespaces but the echo server's), so
	// that no probe meets a connection entry an earlier one left: IPVS
	// keeps its own connection table, which deleting a virtual server
	// does not empty.
	next := map[string]int{}
	srcPort := func(proto string) uint16 {
		base := map[string]int{"tcp": 11000, "udp": 40000}[proto]
		p := uint16(base + next[proto]%21000)
		next[proto]++
		return p
	}
	send := func(proto string, from *netns.NS, dst netip.AddrPort, timeout time.Duration) string {
		var r netns.Reply
		var err error
		if proto == "udp" {
			r, err = from.UDP(dst, srcPort(proto), timeout)
		} else {
			r, err = from.TCPFrom(dst, srcPort(proto), timeout)
		}
		switch {
		case err != nil:
			return "no answer"
		case r.Name != "b":
			return "answered by " + r.Name
		}
		return r.Client.Addr().String()
	}
	// probe is the outcome of each probe, protos by dsts by froms. The
	// patience is the emulated CPU's: no probe expected to fail.
	probe := func() []string {
		var out []string
		for _, proto := range protos {
			for _, dst := range dsts {
				for _, f := range froms {
					out = append(out, send(proto, f.ns, dst.addr, 3*time.Second))
				}
			}
		}
		return out
	}
	answered := func(p *proxies.Process, what string) {
		t.Helper()
		poll.Until(t, 4*time.Minute, what+": node-range pod -> every destination answered", func() error {
			if err := p.Exited(); err != nil {
				t.Fatal(err)
			}
			for _, proto := range protos {
				for _, dst := range dsts {
					if got := send(proto, a.NS, dst.addr, 2*time.Second); got == "no answer" {
						return fmt.Errorf("%s %s: no answer", proto, dst.name)
					}
				}
			}
			return nil
		})
	}

	marks := []string{"dst=" + VIP.String() + " ", "dst=" + VIP6.String() + " ", fmt.Sprintf("dport=%d ", NodePort), "src=" + b.IP.String() + " ", "src=" + b.IP6.String() + " "}
	probeEntries := func() []string {
		t.Helper()
		var entries []string
		for _, fam := range []string{"ipv4", "ipv6"} {
			out, err := node.Run("conntrack", "-L", "-f", fam)
			if err != nil {
				t.Fatalf("conntrack -L -f %s: %v", fam, err)
			}
			for _, l := range strings.Split(out, "\n") {
				if slices.ContainsFunc(marks, func(m string) bool { return strings.Contains(l, m) }) {
					entries = append(entries, l)
				}
			}
		}
		return entries
	}
	// reset empties the node for the next proxy (more than kube-proxy
	// --cleanup or edgeproxy cleanup remove); the conntrack entries of
	// the probes just sent must have been there, and must be gone.
	reset := func() {
		t.Helper()
		if len(probeEntries()) == 0 {
			t.Fatal("conntrack -L showed no entry of the probes just sent: it cannot show that the reset emptied the table")
		}
		if err := proxies.ResetIPVS(node.Do, node.Run); err != nil {
			t.Fatal(err)
		}
		if left := probeEntries(); len(left) > 0 {
			t.Fatalf("conntrack entries of probes outlived the reset:\n%s", strings.Join(left, "\n"))
		}
	}

	runs := 0
	startProxy := func(name string, args ...string) *proxies.Process {
		t.Helper()
		runs++
		logPath := filepath.Join(dir, fmt.Sprintf("%d-%s.log", runs, strings.ReplaceAll(name, " ", "-")))
		return proxies.StartLogged(t, node.Do, name, logPath, guestEnv(path), args...)
	}

	// Both families; other's fd00:244:1::9 is in the IPv6 range, not in
	// the Node's fd00:244::/64.
	cidr := "10.244.0.0/16,fd00:244::/32"
	// The node reaches a ClusterIP from the ClusterIP itself (kube-ipvs0
	// holds it): outside every pod range and not from the bridge, so
	// masqueraded by each detection mode; and with no clusterCIDR by the
	// rule kube-proxy writes for that case (KUBE-CLUSTER-IP src,dst),
	// where iptables mode leaves the node's own address.
	settings := []setting{
		{"ClusterCIDR", proxies.Settings{DetectLocalMode: "ClusterCIDR", ClusterCIDR: cidr}, [5]bool{false, false, true, true, true}},
		{"NodeCIDR", proxies.Settings{DetectLocalMode: "NodeCIDR", ClusterCIDR: cidr}, [5]bool{false, true, true, true, true}},
		{"BridgeInterface", proxies.Settings{DetectLocalMode: "BridgeInterface", PodBridgeInterface: "br0", ClusterCIDR: cidr}, [5]bool{false, false, false, true, true}},
		{"InterfaceNamePrefix", proxies.Settings{DetectLocalMode: "InterfaceNamePrefix", PodInterfaceNamePrefix: "br", ClusterCIDR: cidr}, [5]bool{false, false, false, true, true}},
		{"masqueradeAll", proxies.Settings{MasqueradeAll: true, ClusterCIDR: cidr}, [5]bool{true, true, true, true, true}},
		{"no clusterCIDR", proxies.Settings{}, [5]bool{false, false, false, false, true}},
	}
	if *only != "" {
		names := strings.Split(*only, ",")
		settings = slices.DeleteFunc(settings, func(c setting) bool { return !slices.Contains(names, c.name) })
		if len(settings) != len(names) {
			t.Fatalf("-detect.settings=%s: names a setting that does not exist", *only)
		}
	}
	t.Logf("world ready in %s", time.Since(start).Round(100*time.Millisecond))
	var table []string
	compared := 0
	for _, c := range settings {
		began := time.Now()
		s := c.s
		s.Mode, s.Backend, s.MinSync, s.Sync = proxies.ModeIPVS, "nft", 200*time.Millisecond, 30*time.Second
		slug := strings.ReplaceAll(c.name, " ", "-")

		// kube-proxy first: its outcomes are the reference.
		kp := startProxy("kube-proxy "+c.name, append([]string{setup.KubeProxy}, proxies.KubeProxyArgs(pn, s)...)...)
		poll.Until(t, 4*time.Minute, "kube-proxy "+c.name+" synced both families", func() error {
			if err := kp.Exited(); err != nil {
				t.Fatal(err)
			}
			body, err := node.GET(pn.MetricsAddr, "/metrics", 5*time.Second)
			if err != nil {
				return err
			}
			for _, fam := range []string{"IPv4", "IPv6"} {
				if !proxies.Nonzero(body, proxies.MetricSyncCount, fam) {
					return fmt.Errorf("no whole %s sync in kube-proxy's metrics yet", fam)
				}
			}
			return nil
		})
		kpSynced := time.Since(began)
		answered(kp, "kube-proxy "+c.name)
		want := probe()
		kp.Stop()
		reset()
		for p, proto := range protos {
			for j, dst := range dsts {
				for i, f := range froms {
					wantMasq := c.masqClusterIP[i] || dst.nodePort
					fsrc := f.src
					if dst.addr.Addr().Is6() {
						fsrc = f.src6
					}
					got := want[at(p, j, i)]
					src, err := netip.ParseAddr(got)
					if err != nil || (src == dst.masq) != wantMasq || (src != dst.masq && src != fsrc) {
						t.Errorf("%s: kube-proxy: %s %s -> %s: b saw %s, want masqueraded %v (this world does not show the setting)", c.name, proto, f.name, dst.name, got, wantMasq)
					}
				}
			}
		}

		// Then edgeproxy, until its outcomes are kube-proxy's (its first
		// sync may come before it has read the Node).
		epStart := time.Now()
		cfg := filepath.Join(dir, "edgeproxy-"+slug+".yaml")
		if err := os.WriteFile(cfg, []byte(proxies.EdgeProxyConfig(pn, s, filepath.Join(dir, "state-"+slug))), 0o600); err != nil {
			t.Fatal(err)
		}
		ep := startProxy("edgeproxy "+c.name, setup.EdgeProxy, "run", "--config", cfg)
		answered(ep, "edgeproxy "+c.name)
		epAnswered := time.Since(epStart)
		var got []string
		same := false
		for deadline := time.Now().Add(60 * time.Second); !same && time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
			got = probe()
			same = slices.Equal(got, want)
		}
		ep.Stop()
		reset()
		for p, proto := range protos {
			for j, dst := range dsts {
				for i, f := range froms {
					k := at(p, j, i)
					compared++
					mark := "="
					if got[k] != want[k] {
						mark = "≠"
						t.Errorf("%s: %s %s -> %s: edgeproxy ipvs: b saw %s, kube-proxy ipvs: %s", c.name, proto, f.name, dst.name, got[k], want[k])
					}
					table = append(table, fmt.Sprintf("%-19s %s %-10s %-15s kube-proxy %-14s %s edgeproxy %s", c.name, proto, dst.name, f.name, want[k], mark, got[k]))
				}
			}
		}
		t.Logf("%s: kube-proxy synced both families %s after its start, edgeproxy answered %s after its; %s in all",
			c.name, kpSynced.Round(100*time.Millisecond), epAnswered.Round(100*time.Millisecond), time.Since(began).Round(100*time.Millisecond))
	}
	t.Logf("outcomes in IPVS mode (b's address seen; %s and %s are masqueraded):\n%s", node.Gateway, node.Gateway6, strings.Join(table, "\n"))
	t.Logf("compared %d probes of %d settings in %s", compared, len(settings), time.Since(start).Round(time.Second))
}

// guestEnv is the environment with the backend's programs first in PATH,
// without the VM's marker (the agent would read it as a misspelt
// EDGEPROXY_* config key).
func guestEnv(path string) []string {
	var env []string
	for _, e := range proxies.Env(path) {
		if !strings.HasPrefix(e, vm.GuestEnv+"=") {
			env = append(env, e)
		}
	}
	return env
}
