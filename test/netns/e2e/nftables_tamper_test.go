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

	"github.com/edgeproxy/edgeproxy/datapath/nftables"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/test/proxies"
)

// TestNFTablesTamperRepaired: in nftables mode, a rule inserted by hand
// into one of edgeproxy's chains (every chain keeps its name) is seen
// from the nf_tables events by the running agent, which rewrites the
// table: the rule is gone, the Service answers, the repair is counted
// and the log names nft as the committer. The agent's own syncs (a pod
// leaving, before the edit) are not taken for tampering.
func TestNFTablesTamperRepaired(t *testing.T) {
	bin := rootAgent(t, "nft")

	node := netns.NewNode(t, "node")
	a, b, c := node.AddPod("a"), node.AddPod("b"), node.AddPod("c")
	serve(t, a, b, c)
	w := newAPIWorld(t, node, "nfttamper", 5*time.Minute)
	for _, p := range []*netns.Pod{a, b} {
		w.readyPod(t, p.PodName, p, map[string]string{"app": "web"}, podPorts(false))
	}
	vip := netip.MustParseAddr("10.96.100.10")
	w.createService(t, clusterIPService("web", vip, map[string]string{"app": "web"}, servicePort("tcp", corev1.ProtocolTCP, 80, podPort)))

	dir := t.TempDir()
	pn := proxies.Node{Name: nodeName, Kubeconfig: w.kubeconfig(t, dir), MetricsAddr: "127.0.0.1:10249", HealthzAddr: "0.0.0.0:10256"}
	settings := proxies.Settings{Mode: "nftables", MinSync: 200 * time.Millisecond, Sync: 30 * time.Second, ClusterCIDR: "10.244.0.0/16"}
	cfg := filepath.Join(dir, "config.yaml")
	writeFile(t, cfg, proxies.EdgeProxyConfig(pn, settings, filepath.Join(dir, "state")))
	logOnFailure(t, node, "nft", "list", "ruleset")
	logPath := filepath.Join(dir, "agent.log")
	startAgent(t, node, bin, cfg, logPath)

	answered := func(what string, pods ...string) {
		t.Helper()
		waitFor(t, 90*time.Second, what, func() error {
			r, err := c.TCP(netip.AddrPortFrom(vip, 80), time.Second)
			if err == nil && !strings.Contains(" "+strings.Join(pods, " ")+" ", " "+r.Name+" ") {
				err = fmt.Errorf("answered by %s, want one of %v", r.Name, pods)
			}
			return err
		})
	}
	answered("pod c -> ClusterIP", "a", "b")
	deletePod(w.ctx, t, w.c, w.ns, "a")
	answered("pod c -> ClusterIP after a left", "b")
	repairs := func() string {
		t.Helper()
		m, err := nodeGET(node, pn.MetricsAddr, "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(m, "\n") {
			if v, ok := strings.CutPrefix(l, "edgeproxy_datapath_tampered_total "); ok {
				return v
			}
		}
		t.Fatalf("/metrics lacks edgeproxy_datapath_tampered_total")
		return ""
	}
	if n := repairs(); n != "0" {
		t.Fatalf("the agent's own syncs counted as tampering %s times", n)
	}

	// The Service's own table (its dispatch): the rule there drops it.
	table := nftables.ServiceTable(w.ns, "web")
	if out, err := node.Run("nft", "insert", "rule", "ip", table, "services", "ip", "daddr", vip.String(), "drop"); err != nil {
		t.Fatalf("nft insert rule: %v %s", err, out)
	}
	waitFor(t, 60*time.Second, "the hand-made rule removed", func() error {
		out, err := node.Run("nft", "list", "chain", "ip", table, "services")
		if err == nil && strings.Contains(out, "drop") {
			err = fmt.Errorf("still there:\n%s", out)
		}
		return err
	})
	answered("pod c -> ClusterIP after the repair", "b")
	// The monitor's next look (10 s after a write) has seen the rewrite,
	// which is ours.
	time.Sleep(11 * time.Second)
	if n := repairs(); n != "1" {
		t.Errorf("edgeproxy_datapath_tampered_total = %s, want 1 (the hand edit)", n)
	}
	log, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "changed by someone else") || !strings.Contains(string(log), "by=nft") {
		t.Errorf("the agent's log does not name nft as the one who changed the table")
	}
}
