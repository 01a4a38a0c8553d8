package e2e_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/internal/testkit/switchload"
	"github.com/edgeproxy/edgeproxy/test/proxies"
)

// The agent in nftables mode against a real API server: every frontend
// kind with real packets, an endpoint removed, and kube-proxy's nftables
// table (kept with keepKubeProxy) whose nat chains at the same hooks and
// priority would send the Service elsewhere: edgeproxy's table, written
// after it, comes first, and the first chain that DNATs wins.
func TestNFTablesAgent(t *testing.T) {
	bin := rootAgent(t, "nft")

	node := netns.NewNode(t, "node")
	a, b, c := node.AddPod("a"), node.AddPod("b"), node.AddPod("c")
	client := node.AddClient("client")
	serve(t, a, b, c)
	w := newAPIWorld(t, node, "nft", 5*time.Minute)
	for _, p := range []*netns.Pod{a, b} {
		w.readyPod(t, p.PodName, p, map[string]string{"app": "web"}, podPorts(true))
	}
	vip, lbIP, extIP := netip.MustParseAddr("10.96.100.10"), netip.MustParseAddr("172.30.0.50"), netip.MustParseAddr("172.30.0.60")
	svc := clusterIPService("web", vip, map[string]string{"app": "web"},
		servicePort("tcp", corev1.ProtocolTCP, 80, podPort), servicePort("udp", corev1.ProtocolUDP, 80, podPort))
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	svc.Spec.ExternalIPs = []string{extIP.String()}
	for i := range svc.Spec.Ports {
		svc.Spec.Ports[i].NodePort = 30080
	}
	w.createService(t, svc)
	created, err := w.c.Client().CoreV1().Services(w.ns).Get(w.ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbIP.String()}}
	if _, err := w.c.Client().CoreV1().Services(w.ns).UpdateStatus(w.ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	// A stale kube-proxy nftables table sending the Service's every
	// address to a dead endpoint, before edgeproxy starts.
	dead := "10.244.0.250"
	stale := fmt.Sprintf(`table ip kube-proxy {
	chain nat-prerouting { type nat hook prerouting priority -100; policy accept; ip daddr { %[1]s, %[2]s, %[3]s } dnat to %[4]s; tcp dport 30080 dnat to %[4]s; }
	chain nat-output { type nat hook output priority -100; policy accept; ip daddr { %[1]s, %[2]s, %[3]s } dnat to %[4]s; tcp dport 30080 dnat to %[4]s; }
}
`, vip, lbIP, extIP, dead)
	if out, err := node.Run("sh", "-c", "echo '"+stale+"' | nft -f -"); err != nil {
		t.Fatalf("nft -f: %v: %s", err, out)
	}

	dir := t.TempDir()
	pn := proxies.Node{Name: nodeName, Kubeconfig: w.kubeconfig(t, dir), MetricsAddr: "127.0.0.1:10249", HealthzAddr: "0.0.0.0:10256"}
	settings := proxies.Settings{Mode: "nftables", MinSync: 200 * time.Millisecond, Sync: 30 * time.Second, ClusterCIDR: "10.244.0.0/16", ExternalIPs: true}
	cfg := filepath.Join(dir, "config.yaml")
	writeFile(t, cfg, proxies.EdgeProxyConfig(pn, settings, filepath.Join(dir, "state"))+"keepKubeProxy: true\n")
	logOnFailure(t, node, "nft", "list", "ruleset")
	ag := startAgent(t, node, bin, cfg, filepath.Join(dir, "agent.log"))

	// lands waits until a connection from ns to dst reaches one of pods,
	// from the source want (invalid: any).
	lands := func(what string, ns *netns.NS, dst netip.AddrPort, udp bool, want netip.Addr, pods ...string) {
		t.Helper()
		waitFor(t, 90*time.Second, what, func() error {
			var r netns.Reply
			var err error
			if udp {
				r, err = ns.UDP(dst, 0, time.Second)
			} else {
				r, err = ns.TCP(dst, time.Second)
			}
			switch {
			case err != nil:
				return err
			case !strings.Contains(" "+strings.Join(pods, " ")+" ", " "+r.Name+" "):
				return fmt.Errorf("answered by %s, want one of %v", r.Name, pods)
			case want.IsValid() && r.Client.Addr() != want:
				return fmt.Errorf("the pod saw %s, want %s", r.Client.Addr(), want)
			}
			return nil
		})
	}
	// ClusterIP from a pod: the source is kept (from the cluster CIDR).
	lands("pod c -> ClusterIP tcp", c.NS, netip.AddrPortFrom(vip, 80), false, c.IP, "a", "b")
	lands("pod c -> ClusterIP udp", c.NS, netip.AddrPortFrom(vip, 80), true, c.IP, "a", "b")
	// From outside: masqueraded (externalTrafficPolicy Cluster).
	lands("client -> NodePort", client, netip.AddrPortFrom(node.LinkIP, 30080), false, node.Gateway, "a", "b")
	lands("client -> LoadBalancer IP", client, netip.AddrPortFrom(lbIP, 80), false, node.Gateway, "a", "b")
	lands("client -> externalIP", client, netip.AddrPortFrom(extIP, 80), false, node.Gateway, "a", "b")
	lands("client -> LoadBalancer IP udp", client, netip.AddrPortFrom(lbIP, 80), true, node.Gateway, "a", "b")
	// The node itself, through nat-output.
	waitFor(t, 30*time.Second, "node -> ClusterIP", func() error {
		r, err := node.TCP(netip.AddrPortFrom(vip, 80), time.Second)
		if err == nil && r.Name != "a" && r.Name != "b" {
			err = fmt.Errorf("answered by %s", r.Name)
		}
		return err
	})
	if out, err := node.Run("nft", "list", "table", "ip", "kube-proxy"); err != nil {
		t.Errorf("kube-proxy's table is kept with keepKubeProxy: %v %s", err, out)
	}

	// Pod a leaves: every new connection lands on b, by every frontend.
	deletePod(w.ctx, t, w.c, w.ns, "a")
	for _, dst := range []netip.AddrPort{netip.AddrPortFrom(vip, 80), netip.AddrPortFrom(node.LinkIP, 30080), netip.AddrPortFrom(lbIP, 80), netip.AddrPortFrom(extIP, 80)} {
		from := client
		if dst.Addr() == vip {
			from = c.NS
		}
		waitFor(t, 30*time.Second, "only b answers "+dst.String(), func() error {
			for range 20 {
				r, err := from.TCP(dst, time.Second)
				if err != nil {
					return err
				}
				if r.Name != "b" {
					return fmt.Errorf("answered by %s", r.Name)
				}
			}
			return nil
		})
	}

	// The mode and the datapath's numbers in /metrics and the status.
	metrics, err := nodeGET(node, pn.MetricsAddr, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`edgeproxy_nftables_chains{family="ip"} `, "edgeproxy_nftables_sync_netlink_operations ",
		"kubeproxy_sync_proxy_rules_nftables_sync_failures_total 0", "kubeproxy_sync_full_proxy_rules_duration_seconds_count "} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	out, err := runIn(node, bin, "status", "--config", cfg)
	if err != nil {
		t.Fatalf("edgeproxy status: %v\n%s", err, out)
	}
	t.Logf("edgeproxy status:\n%s", out)
	for _, want := range []string{"mode nftables", "nftables: last apply ", "nftables tables: ip family: 17 tables, ", "ip6 family: 17 tables, "} {
		if !strings.Contains(out, want) {
			t.Errorf("edgeproxy status lacks %q:\n%s", want, out)
		}
	}

	// `edgeproxy cleanup` removes the tables, and succeeds again with
	// none left; kube-proxy's table is not ours.
	ag.kill(t)
	for range 2 {
		flushRules(t, node, bin, cfg)
		assertNoNFTablesMode(t, node)
	}
	if out, err := node.Run("nft", "list", "table", "ip", "kube-proxy"); err != nil {
		t.Errorf("edgeproxy cleanup removed kube-proxy's table: %v %s", err, out)
	}
}

// A live switch between edgeproxy's modes, as a user does it (stop, edit
// the config's mode, start), iptables → nftables → (a restart) nftables
// → iptables, under
// switchload's stream of new connections to one Service and established
// flows to another; one endpoint of the streamed Service is deleted while
// no proxy runs. Per direction: 0 new connections failed and 0 to the
// deleted endpoint once the new mode's first sync is in and the old
// mode's objects are gone (the status reports the takeover), 0
// established flows broken, and nothing of the old mode left in
// `nft list ruleset` or iptables-save.
func TestNFTablesSwitch(t *testing.T) {
	bin := rootAgent(t, "nft", "iptables-nft", "iptables-nft-save", "iptables-legacy-save")

	sn := newSwitchNode(t, 10*time.Minute)
	node, client, w := sn.node, sn.client, sn.api
	dir := t.TempDir()
	path, err := proxies.BackendPath(dir, "nft")
	if err != nil {
		t.Fatal(err)
	}
	pn := proxies.Node{Name: nodeName, Kubeconfig: w.kubeconfig(t, dir), MetricsAddr: "127.0.0.1:10249", HealthzAddr: "0.0.0.0:10256"}
	cfg := filepath.Join(dir, "edgeproxy.yaml")
	writeConfig := func(mode string) {
		t.Helper()
		s := proxies.Settings{Mode: mode, MinSync: 200 * time.Millisecond, Sync: 30 * time.Second, ClusterCIDR: "10.244.0.0/16"}
		if err := os.WriteFile(cfg, []byte(proxies.EdgeProxyConfig(pn, s, filepath.Join(dir, "state"))), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	runs := 0
	start := func(mode string) *proxies.Process {
		t.Helper()
		writeConfig(mode)
		runs++
		p := startProxy(t, node, "edgeproxy", filepath.Join(dir, fmt.Sprintf("%d-%s.log", runs, mode)), path, bin, "run", "--config", cfg)
		// Synced: the status reports the takeover, which follows the
		// first sync and the removal of the other mode's objects.
		waitFor(t, 3*time.Minute, "edgeproxy "+mode+" synced", func() error {
			if err := p.Exited(); err != nil {
				t.Fatal(err)
			}
			body, err := nodeGET(node, pn.MetricsAddr, "/debug/status")
			if err != nil {
				return err
			}
			if !strings.Contains(body, `"kubeProxy"`) {
				return fmt.Errorf("no takeover in the status yet")
			}
			if !strings.Contains(body, `"mode": "`+mode+`"`) {
				return fmt.Errorf("status does not report mode %s", mode)
			}
			return nil
		})
		return p
	}
	cur := start("iptables")
	sn.reaches("c")
	var report []string
	srcPorts := switchload.NewSourcePorts(podPort, heldPort)
	prev := "iptables"
	// nftables → nftables is a restart over the table in the kernel
	// (rewritten in bounded transactions, Service by Service).
	for _, next := range []string{"nftables", "nftables", "iptables"} {
		what := fmt.Sprintf("edgeproxy %s → %s", prev, next)
		sw := switchload.Start(t, client, srcPorts, switchWebVIP, switchSteadyVIP, heldPort)
		sw.WaitNew(20)
		cur.Stop()
		deletePod(w.ctx, t, w.c, w.ns, "c")
		sw.Deleted()
		p := start(next)
		if next == "nftables" {
			assertNoEdgeProxyObjects(t, node)
		} else {
			assertNoNFTablesMode(t, node)
		}
		report = append(report, finishSwitch(t, sw, what))
		cur, prev = p, next
		sn.addPod("c")
		sn.reaches("c")
	}
	t.Logf("switch summary:\n  %s", strings.Join(report, "\n  "))
}

// assertNoNFTablesMode fails t if nftables mode's tables are in the node.
func assertNoNFTablesMode(t *testing.T, node *netns.Node) {
	t.Helper()
	out, err := node.Run("nft", "list", "tables")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasSuffix(strings.TrimSpace(l), " edgeproxy") {
			t.Errorf("nftables mode's table left after the switch: %s", l)
		}
	}
}

// TestNFTablesReloadDatapathSettings: in nftables mode, the datapath
// settings of the config file (clusterCIDR, masqueradeAll,
// iptables.masqueradeBit, nodePortAddresses) edited while the agent runs
// change the rules and the traffic without a restart, and a bad edit
// keeps the rules, as in iptables mode (TestIPTablesReloadDatapathSettings,
// the same body).
func TestNFTablesReloadDatapathSettings(t *testing.T) {
	reloadDatapathSettings(t, reloadMode{
		mode:     "nftables",
		binaries: []string{"nft"},
		list:     []string{"nft", "list", "ruleset"}, // the main table and the service tables
		mark:     func(bit int) string { return fmt.Sprintf("0x%08x", 1<<bit) },
	})
}
