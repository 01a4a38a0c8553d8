package e2e_test

import (
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// Someone flushes edgeproxy's chains by hand: the running agent notices and
// puts them back within seconds, and a foreign rule in a chain of someone
// else's stays untouched.
func TestIPTablesAgentRepairsFlush(t *testing.T) {
	bin := rootAgent(t, "iptables", "iptables-restore")

	node := netns.NewNode(t, "tamper")
	a, b := node.AddPod("a"), node.AddPod("b")
	serve(t, a)
	m := newManifestsAgent(t)
	m.manifest(t, "web.yaml", webManifest(a.IP, nodeName))
	m.writeConfig(t, "clusterCIDR: 10.244.0.0/16\nserver: {healthz: \"\", metrics: \"\"}\nsync: {minPeriod: 200ms, period: 1h}\n")
	// A rule of someone else's, in a chain of someone else's.
	if out, err := node.Run("iptables", "-t", "filter", "-N", "FOREIGN"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if out, err := node.Run("iptables", "-t", "filter", "-A", "FOREIGN", "-s", "203.0.113.7/32", "-j", "DROP"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	m.start(t, node, bin)

	vip := netip.AddrPortFrom(netip.MustParseAddr("10.96.100.10"), 80)
	answered := func() error {
		r, err := b.TCP(vip, time.Second)
		if err == nil && r.Name != "a" {
			err = fmt.Errorf("answered by %s", r.Name)
		}
		return err
	}
	waitFor(t, 60*time.Second, "ClusterIP answered", answered)

	// The period is an hour: only tamper detection can bring the rules back.
	if out, err := node.Run("iptables", "-t", "nat", "-F", "EP-SERVICES"); err != nil {
		t.Fatalf("flush: %v: %s", err, out)
	}
	if err := answered(); err == nil {
		t.Log("answered right after the flush (the repair was quicker than the probe)")
	}
	waitFor(t, 30*time.Second, "ClusterIP answered again after the flush", answered)
	log, _ := os.ReadFile(m.log)
	if !strings.Contains(string(log), "repairing with a full sync") {
		t.Errorf("the repair was not logged:\n%s", log)
	}
	save, err := node.Run("iptables-save", "-t", "filter")
	if err != nil || !strings.Contains(save, "-A FOREIGN -s 203.0.113.7/32 -j DROP") {
		t.Errorf("the foreign rule is gone (%v):\n%s", err, save)
	}
}
