package e2e_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/internal/testkit/switchload"
	"github.com/edgeproxy/edgeproxy/test/cluster"
	"github.com/edgeproxy/edgeproxy/test/proxies"
)

// A switch between kube-proxy and edgeproxy on a live node, as a user
// does it, under a stream of new connections (TCP and UDP) to one
// Service and a set of established flows (TCP and UDP) to another:
//
//   - kube-proxy → edgeproxy: kube-proxy is stopped (its rules stay and
//     keep answering), edgeproxy started; it programs its rules and
//     then removes kube-proxy's.
//   - edgeproxy → kube-proxy: edgeproxy is stopped (its rules stay),
//     `edgeproxy cleanup` run, kube-proxy started: new connections fail
//     until its first sync.
//
// While no proxy runs, one endpoint of the streamed Service ("c") is
// deleted: its server stays up, so a connection that reaches it shows
// stale rules. The switch is complete once the new proxy has synced
// (kube-proxy: its rules and its conntrack sweep; edgeproxy: its rules,
// the takeover and the sweep after it). Per direction the test counts new
// connections (failed before and after the switch is complete),
// connections that reached the deleted endpoint after it, and established
// flows broken (an exchange failed or moved to another pod), and requires
// 0 for all but what happened before the switch was complete.
func TestSwitchKubeProxy(t *testing.T) {
	gate.Root(t)
	bin := agentBinary(t)
	kubeProxy := kubeProxyBinary(t)
	for _, c := range []struct{ backend, edgeMode string }{{"nft", "iptables"}, {"legacy", "iptables"}, {"nft", "nftables"}} {
		name := c.backend
		if c.edgeMode != "iptables" {
			name += "-edgeproxy-" + c.edgeMode
		}
		t.Run(name, func(t *testing.T) {
			gate.Binaries(t, "iptables-"+c.backend, "iptables-"+c.backend+"-restore", "iptables-nft-save", "iptables-legacy-save", "nft")
			switchKubeProxy(t, bin, kubeProxy, c.backend, c.edgeMode)
		})
	}
}

// switchKubeProxy runs the switches with both proxies' iptables on
// backend (kube-proxy's nftables mode is nft's whatever it is), edgeproxy
// in edgeMode (iptables or nftables).
func switchKubeProxy(t *testing.T, bin, kubeProxy, backend, edgeMode string) {
	sn := newSwitchNode(t, 15*time.Minute)
	node, client, w := sn.node, sn.client, sn.api
	c, ctx, ns := w.c, w.ctx, w.ns
	addPod, reaches := sn.addPod, sn.reaches

	dir := t.TempDir()
	kubeconfig := w.kubeconfig(t, dir)
	path, err := proxies.BackendPath(dir, backend)
	if err != nil {
		t.Fatal(err)
	}
	pn := proxies.Node{Name: nodeName, Kubeconfig: kubeconfig, MetricsAddr: "127.0.0.1:10249", HealthzAddr: "0.0.0.0:10256"}
	settings := proxies.Settings{Backend: backend, MinSync: 200 * time.Millisecond, Sync: 30 * time.Second, ClusterCIDR: "10.244.0.0/16"}
	cfg := filepath.Join(dir, "edgeproxy.yaml")
	edge := settings
	edge.Mode = edgeMode
	if err := os.WriteFile(cfg, []byte(proxies.EdgeProxyConfig(pn, edge, filepath.Join(dir, "state"))), 0o600); err != nil {
		t.Fatal(err)
	}

	runs := 0
	start := func(kind proxies.Kind) *proxies.Process {
		t.Helper()
		var args []string
		switch kind {
		case proxies.KubeProxy:
			args = append([]string{kubeProxy}, proxies.KubeProxyArgs(pn, settings)...)
		case proxies.KubeProxyNFTables:
			args = append([]string{kubeProxy}, proxies.KubeProxyNFTablesArgs(pn, settings)...)
		case proxies.EdgeProxy:
			args = []string{bin, "run", "--config", cfg}
		}
		runs++
		return startProxy(t, node, string(kind), filepath.Join(dir, fmt.Sprintf("%d-%s.log", runs, kind)), path, args...)
	}
	// synced waits until the proxy has finished a sync: kube-proxy's
	// last-sync metric is set, edgeproxy's status reports its takeover.
	synced := func(kind proxies.Kind, p *proxies.Process) {
		t.Helper()
		if kind != proxies.EdgeProxy {
			waitKubeProxySynced(t, node, p, pn.MetricsAddr, string(kind)+" synced")
			return
		}
		waitFor(t, 3*time.Minute, string(kind)+" synced", func() error {
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
			return nil
		})
	}
	cur := start(proxies.KubeProxy)
	curKind := proxies.KubeProxy
	synced(curKind, cur)
	reaches("c")
	var report []string
	srcPorts := switchload.NewSourcePorts(podPort, heldPort)
	for _, next := range []proxies.Kind{proxies.EdgeProxy, proxies.KubeProxyNFTables, proxies.EdgeProxy, proxies.KubeProxy} {
		what := fmt.Sprintf("%s → %s", curKind, next)
		sw := switchload.Start(t, client, srcPorts, switchWebVIP, switchSteadyVIP, heldPort)
		sw.WaitNew(20)
		cur.Stop()
		// No proxy runs: c leaves the Service; the old rules still send
		// to it.
		deletePod(ctx, t, c, ns, "c")
		sw.Deleted()
		if next != proxies.EdgeProxy {
			// The way back: edgeproxy's rules go, then kube-proxy
			// starts. (Cleaning up after kube-proxy's first sync has no
			// gap, but the old rules, which may still come first then,
			// leave UDP conntrack entries to the deleted endpoint that
			// kube-proxy's sweep, done by then, never sees.)
			out, err := node.Run("env", "PATH="+path+":"+os.Getenv("PATH"), bin, "cleanup", "--config", cfg)
			if err != nil {
				t.Fatalf("edgeproxy cleanup: %v: %s", err, out)
			}
			assertNoEdgeProxyObjects(t, node)
			assertNoNFTablesMode(t, node)
		}
		p := start(next)
		synced(next, p)
		if next == proxies.EdgeProxy {
			assertNoKubeProxyObjects(t, node)
			if out, err := os.ReadFile(p.Log); err == nil {
				for _, l := range strings.Split(string(out), "\n") {
					if strings.Contains(l, "took over from kube-proxy") {
						t.Logf("%s: %s", what, l)
					}
				}
			}
		}
		report = append(report, finishSwitch(t, sw, what))
		cur, curKind = p, next
		addPod("c")
		reaches("c")
	}
	t.Logf("switch summary:\n  %s", strings.Join(report, "\n  "))
}

// finishSwitch marks sw's switch complete, lets 100 new connections and
// five exchanges a flow follow, stops the traffic, and fails t unless none
// of the connections after the switch failed or reached the deleted
// endpoint and no established flow broke. It returns the switch's line
// for the summary.
func finishSwitch(t *testing.T, sw *switchload.Load, what string) string {
	t.Helper()
	sw.Switched()
	sw.WaitNew(100)
	sw.WaitExchanges(5 * (switchload.HeldFlows + switchload.UDPFlows))
	res := sw.Stop()
	t.Logf("%s: %s", what, res)
	if res.FailedAfter != 0 || res.GoneAfter != 0 || res.HeldBroken != 0 || res.UDPBroken != 0 || res.NewAfter < 100 {
		t.Errorf("%s: %s; want 0 failed after the switch, 0 to the deleted endpoint, 0 established flows broken", what, res)
	}
	return fmt.Sprintf("%s: %s", what, res)
}

// switchNode is the world of the switch tests: a node with pods a, b and c
// (each serving podPort and heldPort) and a client, all without
// TIME_WAIT; on the API server, Services web (a, b and c: TCP and UDP on
// port 80) at switchWebVIP and steady (a and b: heldPort and UDP on port
// 80) at switchSteadyVIP. A failed test logs the node's iptables and
// nftables rules.
type switchNode struct {
	t      *testing.T
	node   *netns.Node
	pods   map[string]*netns.Pod
	client *netns.NS
	api    *apiWorld
}

var switchWebVIP, switchSteadyVIP = netip.MustParseAddr("10.96.100.10"), netip.MustParseAddr("10.96.100.11")

func newSwitchNode(t *testing.T, timeout time.Duration) *switchNode {
	t.Helper()
	sn := &switchNode{t: t, node: netns.NewNode(t, "node"), pods: map[string]*netns.Pod{}}
	for _, name := range []string{"a", "b", "c"} {
		p := sn.node.AddPod(name)
		if err := p.Serve(podPort); err != nil {
			t.Fatal(err)
		}
		if err := switchload.ServeHeld(t, p, heldPort); err != nil {
			t.Fatal(err)
		}
		sn.pods[name] = p
	}
	sn.client = sn.node.AddClient("client")
	// Thousands of connections to three servers: no stall from a tuple
	// still in TIME_WAIT may count as a failed switch.
	for _, n := range []*netns.NS{sn.node.NS, sn.pods["a"].NS, sn.pods["b"].NS, sn.pods["c"].NS, sn.client} {
		if err := n.NoTimeWait(); err != nil {
			t.Fatal(err)
		}
	}
	sn.api = newAPIWorld(t, sn.node, "switch", timeout)
	for _, name := range []string{"a", "b", "c"} {
		sn.addPod(name)
	}
	sn.api.createService(t, clusterIPService("web", switchWebVIP, map[string]string{"app": "web"},
		servicePort("tcp", corev1.ProtocolTCP, 80, podPort), servicePort("udp", corev1.ProtocolUDP, 80, podPort)))
	sn.api.createService(t, clusterIPService("steady", switchSteadyVIP, map[string]string{"steady": "yes"},
		servicePort("held", corev1.ProtocolTCP, heldPort, heldPort), servicePort("udp", corev1.ProtocolUDP, 80, podPort)))
	t.Cleanup(func() {
		if t.Failed() {
			for _, cmd := range [][]string{{"iptables-nft-save"}, {"iptables-legacy-save"}, {"nft", "list", "ruleset"}} {
				out, _ := sn.node.Run(cmd[0], cmd[1:]...)
				t.Logf("%s in the node:\n%s", strings.Join(cmd, " "), out)
			}
		}
	})
	return sn
}

// addPod makes pod name ready on the API server: in web, and in steady
// but for c.
func (sn *switchNode) addPod(name string) {
	sn.t.Helper()
	labels := map[string]string{"app": "web"}
	if name != "c" {
		labels["steady"] = "yes"
	}
	ports := append(podPorts(true), corev1.ContainerPort{Name: "held", ContainerPort: heldPort, Protocol: corev1.ProtocolTCP})
	sn.api.readyPod(sn.t, name, sn.pods[name], labels, ports)
}

// reaches waits until a new connection to web lands on pod name.
func (sn *switchNode) reaches(name string) {
	sn.t.Helper()
	waitFor(sn.t, 60*time.Second, "web reaches "+name, func() error {
		for range 30 {
			if r, err := sn.client.TCP(netip.AddrPortFrom(switchWebVIP, 80), time.Second); err == nil && r.Name == name {
				return nil
			}
		}
		return fmt.Errorf("no connection reached %s", name)
	})
}

const heldPort = 9090

// deletePod deletes pod name at once (no kubelet finishes a graceful
// deletion here) and waits until it is gone, from the API and from every
// EndpointSlice: the EndpointSlice controller drops it a moment later
// (seconds on a loaded machine), and a proxy started before then is
// right to send traffic to it.
func deletePod(ctx context.Context, t *testing.T, c *cluster.Cluster, ns, name string) {
	t.Helper()
	zero := int64(0)
	pods := c.Client().CoreV1().Pods(ns)
	if err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "pod "+name+" gone", func() error {
		if _, err := pods.Get(ctx, name, metav1.GetOptions{}); err == nil {
			return fmt.Errorf("pod %s still exists", name)
		}
		slices, err := c.Client().DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, s := range slices.Items {
			for _, e := range s.Endpoints {
				if e.TargetRef != nil && e.TargetRef.Name == name {
					return fmt.Errorf("EndpointSlice %s still lists pod %s", s.Name, name)
				}
			}
		}
		return nil
	})
}

// assertNoKubeProxyObjects fails t if kube-proxy's chains or tables are
// left in the node (either iptables backend, nftables).
func assertNoKubeProxyObjects(t *testing.T, node *netns.Node) {
	t.Helper()
	for _, save := range []string{"iptables-nft-save", "iptables-legacy-save"} {
		out, err := node.Run(save)
		if err != nil {
			t.Fatal(err)
		}
		for _, chain := range []string{"KUBE-SERVICES", "KUBE-SVC-", "KUBE-SEP-", "KUBE-POSTROUTING", "KUBE-PROXY-"} {
			if strings.Contains(out, chain) {
				t.Errorf("%s: kube-proxy's %s left after the takeover", save, chain)
			}
		}
	}
	if out, err := node.Run("nft", "list", "tables"); err != nil || strings.Contains(out, "kube-proxy") {
		t.Errorf("nftables after the takeover: %s %v", out, err)
	}
}

// edgeProxyChain finds an edgeproxy chain (EP-…, not KUBE-SEP-…) in a
// listing.
var edgeProxyChain = regexp.MustCompile(`(?m)(^:|^-A |-j )EP-`)

// assertNoEdgeProxyObjects fails t if an edgeproxy chain is left.
func assertNoEdgeProxyObjects(t *testing.T, node *netns.Node) {
	t.Helper()
	for _, save := range []string{"iptables-nft-save", "iptables-legacy-save"} {
		out, err := node.Run(save)
		if err != nil {
			t.Fatal(err)
		}
		if edgeProxyChain.MatchString(out) {
			t.Errorf("%s: edgeproxy rules left after `edgeproxy cleanup`:\n%s", save, out)
		}
	}
}
