package e2e_test

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/test/cluster"
	"github.com/edgeproxy/edgeproxy/test/proxies"
)

// detectLocalWorld is this node's Node with its pod range and a
// ClusterIP Service backed by the pod at ep.
func detectLocalWorld(ep netip.Addr) string {
	return `apiVersion: v1
kind: Node
metadata: {name: node1}
spec: {podCIDR: 10.244.0.0/24, podCIDRs: [10.244.0.0/24]}
status: {addresses: [{type: InternalIP, address: 192.168.77.1}]}
---
` + tcpServiceManifest("web", netip.MustParseAddr("10.96.100.10"), ep)
}

// TestIPTablesDetectLocalModes: the agent with each of kube-proxy's
// local-traffic detection modes, real traffic to a ClusterIP. A pod in
// this node's range on the bridge (a) is never masqueraded and the
// outside client always is; what tells the modes apart is a pod on the
// bridge whose address is in the cluster range but not this node's
// (other), and one whose address is in no pod range (stray).
func TestIPTablesDetectLocalModes(t *testing.T) {
	bin := rootAgent(t, "iptables", "iptables-restore")
	for _, c := range []struct {
		mode, extra          string
		otherMasq, strayMasq bool
	}{
		{"ClusterCIDR", "clusterCIDR: 10.244.0.0/16\n", false, true},
		{"NodeCIDR", "clusterCIDR: 10.244.0.0/16\n", true, true}, // clusterCIDR is not used
		{"BridgeInterface", "detectLocal: {bridgeInterface: br0}\n", false, false},
		{"InterfaceNamePrefix", "detectLocal: {interfaceNamePrefix: br}\n", false, false},
	} {
		t.Run(c.mode, func(t *testing.T) {
			node := netns.NewNode(t, "node")
			a, b := node.AddPod("a"), node.AddPod("b")
			other := node.AddPodAddrs("other", netip.MustParseAddr("10.244.1.9"), netip.MustParseAddr("fd00:244:1::9"))
			stray := node.AddPodAddrs("stray", netip.MustParseAddr("172.16.0.9"), netip.MustParseAddr("fd00:16::9"))
			client := node.AddClient("client")
			serve(t, b)
			m := newManifestsAgent(t)
			// This node's Node with its pod range, in place of the plain one.
			m.manifest(t, "node.yaml", detectLocalWorld(b.IP))
			m.writeConfig(t, fmt.Sprintf("detectLocalMode: %s\n%ssync: {minPeriod: 200ms, period: 30s}\n", c.mode, c.extra))
			logOnFailure(t, node, "iptables-save", "-t", "nat")
			m.start(t, node, bin)

			vip := netip.AddrPortFrom(netip.MustParseAddr("10.96.100.10"), 80)
			waitFor(t, 60*time.Second, "a -> ClusterIP answered by b", func() error {
				r, err := a.TCP(vip, time.Second)
				if err == nil && r.Name != "b" {
					err = fmt.Errorf("answered by %s", r.Name)
				}
				return err
			})
			for _, fl := range []struct {
				name string
				from *netns.NS
				src  netip.Addr
				masq bool
			}{
				{"pod on the bridge in this node's range", a.NS, a.IP, false},
				{"pod on the bridge in another node's range", other.NS, other.IP, c.otherMasq},
				{"pod on the bridge outside every range", stray.NS, stray.IP, c.strayMasq},
				{"outside client", client, netip.MustParseAddr("192.168.77.2"), true},
			} {
				r, err := fl.from.TCP(vip, 2*time.Second)
				if err != nil || r.Name != "b" {
					t.Errorf("%s -> ClusterIP: %+v, %v", fl.name, r, err)
					continue
				}
				if masq := r.Client.Addr() != fl.src; masq != fl.masq {
					t.Errorf("%s -> ClusterIP: b saw %s (masqueraded %v), want masqueraded %v", fl.name, r.Client.Addr(), masq, fl.masq)
				}
			}
		})
	}
}

// detectLocalBackends are the iptables backends TestDetectLocalAgainstKubeProxy
// runs both proxies on, each with the modes of edgeproxy it holds to
// kube-proxy in iptables mode on that backend (nftables mode uses no
// iptables program: once is enough).
var detectLocalBackends = []struct {
	backend, save string
	modes         []string
}{
	{"nft", "iptables-nft-save", []string{"iptables", "nftables"}},
	{"legacy", "iptables-legacy-save", []string{"iptables"}},
}

// TestDetectLocalAgainstKubeProxy: for each local-traffic detection
// setting — kube-proxy's four --detect-local-mode values,
// --masquerade-all, and no --cluster-cidr — and each iptables backend
// (iptables-nft, iptables-legacy), kube-proxy in iptables mode and then
// edgeproxy (iptables mode; on iptables-nft nftables mode too) run in one
// dual-stack node world, one after the other (the node's rules and
// conntrack table emptied between, and the conntrack table checked
// empty), and the same probes go to a ClusterIP and a NodePort, TCP and
// UDP, in both families, from a pod in this node's range, a pod on the
// bridge in another node's range, a pod in no range, the outside client
// and the node itself. A probe's outcome is the source address the
// endpoint saw (kept or masqueraded), or no answer; edgeproxy's must be
// kube-proxy's for every probe. kube-proxy's column is anchored on what
// its settings mean, so that a world in which detection never mattered
// fails instead of matching itself.
func TestDetectLocalAgainstKubeProxy(t *testing.T) {
	bin := rootAgent(t, "iptables-nft", "iptables-nft-restore", "iptables-nft-save", "iptables-legacy", "iptables-legacy-restore", "iptables-legacy-save", "nft", "conntrack")
	kubeProxy := kubeProxyBinary(t)

	node := netns.NewNode(t, "node")
	a, b := node.AddPod("a"), node.AddPod("b")
	other := node.AddPodAddrs("other", netip.MustParseAddr("10.244.1.9"), netip.MustParseAddr("fd00:244:1::9"))
	stray := node.AddPodAddrs("stray", netip.MustParseAddr("172.16.0.9"), netip.MustParseAddr("fd00:16::9"))
	client := node.AddClient("client")
	serve(t, b)
	// A dual-stack world: Service ranges, the Node's addresses and pod
	// ranges, b's addresses and the Service in both families.
	hostIP, _ := node.LinkHost()
	w := &apiWorld{c: cluster.New(t, cluster.Options{BindAddress: hostIP.String(), ServiceCIDR: "10.96.0.0/16,fd00:96::/112"}), hostIP: hostIP, ns: "detect"}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	t.Cleanup(cancel)
	w.ctx = ctx
	if err := w.c.CreateNamespace(ctx, w.ns); err != nil {
		t.Fatal(err)
	}
	n, err := w.c.CreateNode(ctx, nodeName, "zone-a", node.LinkIP.String(), node.LinkIP6.String())
	if err != nil {
		t.Fatal(err)
	}
	// This node's pod ranges, for NodeCIDR (kube-proxy waits for them).
	n.Spec.PodCIDR, n.Spec.PodCIDRs = "10.244.0.0/24", []string{"10.244.0.0/24", "fd00:244::/64"}
	if _, err := w.c.Client().CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.c.CreateReadyPodIPs(ctx, w.ns, "b", nodeName, []string{b.IP.String(), b.IP6.String()}, map[string]string{"app": "web"}, podPorts(true)); err != nil {
		t.Fatal(err)
	}
	vip, vip6 := netip.MustParseAddr("10.96.100.10"), netip.MustParseAddr("fd00:96::10")
	svc := clusterIPService("web", vip, map[string]string{"app": "web"},
		servicePort("tcp", corev1.ProtocolTCP, 80, podPort), servicePort("udp", corev1.ProtocolUDP, 80, podPort))
	dual := corev1.IPFamilyPolicyRequireDualStack
	svc.Spec.Type, svc.Spec.IPFamilyPolicy = corev1.ServiceTypeNodePort, &dual
	svc.Spec.ClusterIPs = []string{vip.String(), vip6.String()}
	svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	for i := range svc.Spec.Ports {
		svc.Spec.Ports[i].NodePort = 30080
	}
	w.createService(t, svc)

	dir := t.TempDir()
	kubeconfig := w.kubeconfig(t, dir)
	pn := proxies.Node{Name: nodeName, Kubeconfig: kubeconfig, MetricsAddr: "127.0.0.1:10249", HealthzAddr: "0.0.0.0:10256"}

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
		{"ClusterIP", netip.AddrPortFrom(vip, 80), false, node.Gateway},
		{"NodePort", netip.AddrPortFrom(node.LinkIP, 30080), true, node.Gateway},
		{"ClusterIP6", netip.AddrPortFrom(vip6, 80), false, node.Gateway6},
		{"NodePort6", netip.AddrPortFrom(node.LinkIP6, 30080), true, node.Gateway6},
	}
	protos := []string{"tcp", "udp"}
	// at is the index of a probe's outcome in what probe returns.
	at := func(p, d, f int) int { return (p*len(dsts)+d)*len(froms) + f }

	// Each UDP probe has a source port of its own (below the ephemeral
	// range, never one a TCP probe takes), so that no probe meets a
	// conntrack entry an earlier one left: each shows the rules in place.
	nextUDP := 0
	udpPort := func() uint16 { nextUDP++; return uint16(20000 + nextUDP%10000) }
	// send is one probe: the address b saw, "no answer", or "answered
	// by" another.
	send := func(proto string, from *netns.NS, dst netip.AddrPort, timeout time.Duration) string {
		var r netns.Reply
		var err error
		if proto == "udp" {
			r, err = from.UDP(dst, udpPort(), timeout)
		} else {
			r, err = from.TCP(dst, timeout)
		}
		switch {
		case err != nil:
			return "no answer"
		case r.Name != "b":
			return "answered by " + r.Name
		}
		return r.Client.Addr().String()
	}
	// probe is the outcome of each probe, protos by dsts by froms.
	probe := func() []string {
		var out []string
		for _, proto := range protos {
			for _, dst := range dsts {
				for _, f := range froms {
					out = append(out, send(proto, f.ns, dst.addr, 2*time.Second))
				}
			}
		}
		return out
	}

	// answered waits until the node-range pod reaches every destination
	// by every protocol through proxy p.
	answered := func(t *testing.T, p *proxies.Process, what string) {
		t.Helper()
		waitFor(t, 60*time.Second, what+": node-range pod -> every destination answered", func() error {
			if err := p.Exited(); err != nil {
				t.Fatal(err)
			}
			for _, proto := range protos {
				for _, dst := range dsts {
					if got := send(proto, a.NS, dst.addr, time.Second); got == "no answer" {
						return fmt.Errorf("%s %s: no answer", proto, dst.name)
					}
				}
			}
			return nil
		})
	}

	// probeEntries are the node's conntrack entries of probes: to or from
	// a Service address, the NodePort or b.
	marks := []string{"dst=" + vip.String() + " ", "dst=" + vip6.String() + " ", "dport=30080 ", "src=" + b.IP.String() + " ", "src=" + b.IP6.String() + " "}
	probeEntries := func(t *testing.T) []string {
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
	// reset empties the node for the next proxy: proxies.Reset removes
	// more than kube-proxy --cleanup or edgeproxy cleanup do, both
	// iptables backends, nftables and conntrack. Then no conntrack entry
	// of a probe may be left, or the next proxy's probes could be
	// answered by the last one's NAT; after a proxy's probes (probed)
	// their entries must have been seen before, or the check proves
	// nothing.
	reset := func(t *testing.T, probed bool) {
		t.Helper()
		if before := probeEntries(t); probed && len(before) == 0 {
			t.Fatal("conntrack -L showed no entry of the probes just sent: it cannot show that the reset emptied the table")
		}
		if err := proxies.Reset(node.Run); err != nil {
			t.Fatal(err)
		}
		if left := probeEntries(t); len(left) > 0 {
			t.Fatalf("conntrack entries of probes outlived the reset:\n%s", strings.Join(left, "\n"))
		}
	}

	// Both families; other's fd00:244:1::9 is in the IPv6 range, not in
	// the Node's fd00:244::/64.
	cidr := "10.244.0.0/16,fd00:244::/32"
	settings := []struct {
		name string
		s    proxies.Settings
		// masqClusterIP is kube-proxy's anchor: which sources (froms
		// order) it masquerades to the ClusterIP, in both families and
		// both protocols. Every NodePort probe is masqueraded
		// (externalTrafficPolicy Cluster).
		masqClusterIP [5]bool
	}{
		{"ClusterCIDR", proxies.Settings{DetectLocalMode: "ClusterCIDR", ClusterCIDR: cidr}, [5]bool{false, false, true, true, true}},
		{"NodeCIDR", proxies.Settings{DetectLocalMode: "NodeCIDR", ClusterCIDR: cidr}, [5]bool{false, true, true, true, true}},
		{"BridgeInterface", proxies.Settings{DetectLocalMode: "BridgeInterface", PodBridgeInterface: "br0", ClusterCIDR: cidr}, [5]bool{false, false, false, true, true}},
		{"InterfaceNamePrefix", proxies.Settings{DetectLocalMode: "InterfaceNamePrefix", PodInterfaceNamePrefix: "br", ClusterCIDR: cidr}, [5]bool{false, false, false, true, true}},
		{"masqueradeAll", proxies.Settings{MasqueradeAll: true, ClusterCIDR: cidr}, [5]bool{true, true, true, true, true}},
		{"no clusterCIDR", proxies.Settings{}, [5]bool{false, false, false, false, false}},
	}
	for _, be := range detectLocalBackends {
		t.Run(be.backend, func(t *testing.T) {
			path, err := proxies.BackendPath(dir, be.backend)
			if err != nil {
				t.Fatal(err)
			}
			logOnFailure(t, node, be.save, "-t", "nat")
			reset(t, false) // what the last backend's run left
			var table []string
			for _, c := range settings {
				s := c.s
				s.Backend, s.MinSync, s.Sync = be.backend, 200*time.Millisecond, 30*time.Second
				slug := be.backend + "-" + strings.ReplaceAll(c.name, " ", "-")

				// kube-proxy first: its outcomes are the reference.
				kp := startProxy(t, node, "kube-proxy "+c.name, filepath.Join(dir, "kube-proxy-"+slug+".log"), path,
					append([]string{kubeProxy}, proxies.KubeProxyArgs(pn, s)...)...)
				waitKubeProxySynced(t, node, kp, pn.MetricsAddr, "kube-proxy "+c.name+" synced")
				answered(t, kp, "kube-proxy "+c.name) // its IPv6 rules too
				want := probe()
				kp.Stop()
				reset(t, true)
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

				// Then edgeproxy in each mode, until its outcomes are
				// kube-proxy's (its first sync may come before it has
				// read the Node).
				gots := map[string][]string{}
				for _, mode := range be.modes {
					s.Mode = mode
					cfg := filepath.Join(dir, "edgeproxy-"+mode+"-"+slug+".yaml")
					writeFile(t, cfg, proxies.EdgeProxyConfig(pn, s, filepath.Join(dir, "state-"+mode+"-"+slug)))
					ep := startProxy(t, node, "edgeproxy "+mode+" "+c.name, filepath.Join(dir, "edgeproxy-"+mode+"-"+slug+".log"), path, bin, "run", "--config", cfg)
					answered(t, ep, "edgeproxy "+mode+" "+c.name)
					var got []string
					same := false
					for deadline := time.Now().Add(30 * time.Second); !same && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
						got = probe()
						same = slices.Equal(got, want)
					}
					ep.Stop()
					reset(t, true)
					gots[mode] = got
				}
				for p, proto := range protos {
					for j, dst := range dsts {
						for i, f := range froms {
							k := at(p, j, i)
							line := fmt.Sprintf("%-19s %s %-10s %-15s kube-proxy %-14s", c.name, proto, dst.name, f.name, want[k])
							for _, mode := range be.modes {
								got := gots[mode]
								mark := "="
								if got[k] != want[k] {
									mark = "≠"
									t.Errorf("%s: %s %s -> %s: edgeproxy %s: b saw %s, kube-proxy: %s", c.name, proto, f.name, dst.name, mode, got[k], want[k])
								}
								line += fmt.Sprintf(" %s edgeproxy %s %-14s", mark, mode, got[k])
							}
							table = append(table, strings.TrimSpace(line))
						}
					}
				}
			}
			t.Logf("outcomes on iptables-%s (b's address seen; %s and %s are masqueraded):\n%s", be.backend, node.Gateway, node.Gateway6, strings.Join(table, "\n"))
		})
	}
}
