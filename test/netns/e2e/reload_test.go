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

// TestIPTablesReloadDatapathSettings: the datapath settings of the
// config file (clusterCIDR, masqueradeAll, iptables.masqueradeBit,
// nodePortAddresses) edited while the agent runs change the rules and
// the traffic without a restart (kube-proxy restarts for that); a bad
// edit keeps the rules of the running config.
func TestIPTablesReloadDatapathSettings(t *testing.T) {
	bin := rootAgent(t, "iptables", "iptables-restore", "iptables-save")

	node := netns.NewNode(t, "node")
	a, b := node.AddPod("a"), node.AddPod("b")
	client := node.AddClient("client")
	serve(t, a)
	m := newManifestsAgent(t)
	m.manifest(t, "web.yaml", webManifest(a.IP, nodeName))
	// Each step's settings after the same sync settings.
	config := func(extra string) {
		t.Helper()
		m.writeConfig(t, "sync: {minPeriod: 200ms, period: 30s}\n"+extra)
	}
	config("clusterCIDR: 10.244.0.0/16\n")
	logOnFailure(t, node, "iptables-save", "-t", "nat")
	ag := m.start(t, node, bin)
	pid := ag.cmd.Process.Pid

	vip := netip.AddrPortFrom(netip.MustParseAddr("10.96.100.10"), 80)
	nodePort := netip.AddrPortFrom(node.LinkIP, 30080)
	// seen waits until pod b's connection to the ClusterIP reaches a from
	// src (b itself, or the node when masqueraded).
	seen := func(what string, src netip.Addr) {
		t.Helper()
		waitFor(t, 30*time.Second, what, func() error {
			r, err := b.TCP(vip, time.Second)
			if err == nil && (r.Name != "a" || r.Client.Addr() != src) {
				err = fmt.Errorf("answered by %s, which saw %s; want a seeing %s", r.Name, r.Client.Addr(), src)
			}
			return err
		})
	}
	nat := func() string {
		t.Helper()
		out, err := node.Run("iptables-save", "-t", "nat")
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	seen("b -> ClusterIP, b inside clusterCIDR: not masqueraded", b.IP)
	waitFor(t, 30*time.Second, "client -> NodePort", func() error { _, err := client.TCP(nodePort, time.Second); return err })

	// masqueradeAll and another mark bit.
	config("clusterCIDR: 10.244.0.0/16\nmasqueradeAll: true\niptables: {masqueradeBit: 12}\n")
	seen("b -> ClusterIP with masqueradeAll: masqueraded", node.Gateway)
	if rules := nat(); !strings.Contains(rules, "0x1000/0x1000") || strings.Contains(rules, "0x4000") {
		t.Fatalf("nat rules after masqueradeBit 14 -> 12: want mark 0x1000 only:\n%s", rules)
	}

	// A bad edit is refused whole: the rules stay.
	before := nat()
	config("clusterCIDR: 10.244.0.0/16\nmasqueradeAll: false\niptables: {masqueradeBit: 40}\n")
	waitFor(t, 30*time.Second, "the bad edit logged", func() error {
		out, _ := os.ReadFile(ag.log)
		if !strings.Contains(string(out), "iptables.masqueradeBit") {
			return fmt.Errorf("no refusal naming iptables.masqueradeBit in the log")
		}
		return nil
	})
	time.Sleep(time.Second) // a sync the edit would have caused (minPeriod 200ms)
	if after := nat(); stripCounters(after) != stripCounters(before) {
		t.Fatalf("a refused edit changed the rules:\n--- before\n%s\n--- after\n%s", before, after)
	}
	seen("b -> ClusterIP after the refused edit: still masqueraded", node.Gateway)

	// A clusterCIDR that b is not in: masqueraded without masqueradeAll;
	// node ports on no address of the node's.
	config("clusterCIDR: 10.250.0.0/16\nnodePortAddresses: [10.99.0.0/16]\n")
	waitFor(t, 30*time.Second, "mark 0x4000 back", func() error {
		if !strings.Contains(nat(), "0x4000/0x4000") {
			return fmt.Errorf("no mark 0x4000")
		}
		return nil
	})
	seen("b -> ClusterIP, b outside clusterCIDR: masqueraded", node.Gateway)
	waitRefused(t, client, nodePort, "NodePort closed outside nodePortAddresses")

	// Back: b in clusterCIDR again, node ports on every address.
	config("clusterCIDR: 10.244.0.0/16\n")
	seen("b -> ClusterIP, b inside clusterCIDR again: not masqueraded", b.IP)
	waitFor(t, 30*time.Second, "client -> NodePort again", func() error { _, err := client.TCP(nodePort, time.Second); return err })

	// One process did it all: nothing restarts the agent in this test,
	// and it is still running.
	if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err != nil || strings.Fields(string(stat))[2] == "Z" {
		t.Fatalf("the agent (pid %d) is gone: %s %v", pid, stat, err)
	}
}

// stripCounters drops iptables-save's comment lines and chain counters,
// which move with traffic.
func stripCounters(save string) string {
	var out []string
	for _, l := range strings.Split(save, "\n") {
		if strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasPrefix(l, ":") {
			l, _, _ = strings.Cut(l, " [")
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}
