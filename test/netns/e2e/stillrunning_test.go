package e2e_test

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	epagent "github.com/edgeproxy/edgeproxy/agent"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/test/proxies"
)

// TestKubeProxyStillRunning starts edgeproxy on a node where kube-proxy
// (iptables mode, on other ports) still runs: edgeproxy removes its rules
// after its first sync, kube-proxy writes them again, and edgeproxy
// reports that once at its first look after the removal (a minute later)
// and removes nothing more. Connections to the Service, which both
// proxies program alike, never fail.
func TestKubeProxyStillRunning(t *testing.T) {
	bin := rootAgent(t, "iptables-nft", "iptables-nft-restore", "iptables-nft-save", "nft")
	kubeProxy := kubeProxyBinary(t)
	node := netns.NewNode(t, "node")
	a := node.AddPod("a")
	serve(t, a)
	client := node.AddClient("client") // gives the node its address
	// Ten thousand connections to one echo server: no stall from a tuple
	// still in TIME_WAIT may count as a failure of the proxies.
	for _, n := range []*netns.NS{node.NS, a.NS, client} {
		if err := n.NoTimeWait(); err != nil {
			t.Fatal(err)
		}
	}
	w := newAPIWorld(t, node, "still", 10*time.Minute)
	w.readyPod(t, "a", a, map[string]string{"app": "web"}, podPorts(true))
	vip := netip.MustParseAddr("10.96.100.10")
	w.createService(t, clusterIPService("web", vip, map[string]string{"app": "web"},
		servicePort("tcp", corev1.ProtocolTCP, 80, podPort), servicePort("udp", corev1.ProtocolUDP, 80, podPort)))

	dir := t.TempDir()
	kubeconfig := w.kubeconfig(t, dir)
	path, err := proxies.BackendPath(dir, "nft")
	if err != nil {
		t.Fatal(err)
	}
	settings := proxies.Settings{Backend: "nft", MinSync: 200 * time.Millisecond, Sync: 30 * time.Second, ClusterCIDR: "10.244.0.0/16"}
	// Other ports than edgeproxy's: with the same ones edgeproxy would
	// not start at all while kube-proxy runs.
	kpNode := proxies.Node{Name: nodeName, Kubeconfig: kubeconfig, MetricsAddr: "127.0.0.1:10349", HealthzAddr: "0.0.0.0:10356"}
	epNode := proxies.Node{Name: nodeName, Kubeconfig: kubeconfig, MetricsAddr: "127.0.0.1:10249", HealthzAddr: "0.0.0.0:10256"}
	cfg := filepath.Join(dir, "edgeproxy.yaml")
	if err := os.WriteFile(cfg, []byte(proxies.EdgeProxyConfig(epNode, settings, filepath.Join(dir, "state"))), 0o600); err != nil {
		t.Fatal(err)
	}
	start := func(name string, args ...string) *proxies.Process {
		t.Helper()
		return startProxy(t, node, name, filepath.Join(dir, name+".log"), path, args...)
	}

	kp := start("kube-proxy", append([]string{kubeProxy}, proxies.KubeProxyArgs(kpNode, settings)...)...)
	waitKubeProxySynced(t, node, kp, kpNode.MetricsAddr, "kube-proxy synced")

	// A stream of new connections from a pod on the node, for the whole
	// test (bounded in count and time).
	stream := startStream(a.NS, netip.AddrPortFrom(vip, 80), 5*time.Millisecond, 60000, 5*time.Minute)
	defer stream.stop()

	ep := start("edgeproxy", bin, "run", "--config", cfg)
	status := func() (*epagent.KubeProxyStatus, error) {
		if err := ep.Exited(); err != nil {
			t.Fatal(err)
		}
		body, err := nodeGET(node, epNode.MetricsAddr, "/debug/status")
		if err != nil {
			return nil, err
		}
		var st epagent.Status
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			return nil, err
		}
		if st.KubeProxy == nil {
			return nil, fmt.Errorf("no takeover yet")
		}
		return st.KubeProxy, nil
	}
	var st *epagent.KubeProxyStatus
	waitFor(t, 2*time.Minute, "edgeproxy took over", func() (err error) { st, err = status(); return err })
	if st.Removed.Chains() == 0 {
		t.Fatalf("edgeproxy removed nothing of the running kube-proxy's: %+v", st)
	}
	t.Logf("removed: %s", st.Removed)
	// kube-proxy writes its rules again (its canary chain is gone); the
	// first look, a minute after the removal, sees them.
	waitFor(t, 3*time.Minute, "edgeproxy saw kube-proxy's rules come back", func() error {
		st, err = status()
		if err == nil && len(st.Returned) == 0 {
			err = fmt.Errorf("not yet")
		}
		return err
	})
	t.Logf("returned: %s", st.Returned)
	if st.Removed.String() == "" || st.Returned.Chains() == 0 {
		t.Errorf("status %+v", st)
	}
	// Nothing more is removed: the rules kube-proxy wrote again stay.
	time.Sleep(2 * time.Second)
	out, err := node.Run("iptables-nft-save", "-t", "nat")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, ":KUBE-SERVICES") {
		t.Errorf("kube-proxy's rules gone again:\n%s", out)
	}
	logText, _ := os.ReadFile(ep.Log)
	if n := strings.Count(string(logText), "kube-proxy wrote its rules again"); n != 1 {
		t.Errorf("%d warnings that kube-proxy wrote its rules again, want 1", n)
	}
	repairs := strings.Count(string(logText), "repairing with a full sync")
	if f := stream.failed.Load(); f != 0 {
		t.Errorf("%d of %d connections failed while both proxies ran: %v", f, f+stream.ok.Load(), stream.firstErr.Load())
	}
	t.Logf("%d connections while both proxies ran, %d failed; edgeproxy tamper repairs meanwhile: %d", stream.ok.Load()+stream.failed.Load(), stream.failed.Load(), repairs)
}
