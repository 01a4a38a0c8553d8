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
	reloadDatapathSettings(t, reloadMode{
		mode:     "iptables",
		binaries: []string{"iptables", "iptables-restore", "iptables-save"},
		list:     []string{"iptables-save", "-t", "nat"},
		mark:     func(bit int) string { return fmt.Sprintf("%#x/%#x", 1<<bit, 1<<bit) },
	})
}

// reloadMode is what reloadDatapathSettings needs to know of a mode: the
// programs it needs, the command that lists its rules, and how a
// masquerade mark of bit shows in that listing.
type reloadMode struct {
	mode     string
	binaries []string
	list     []string
	mark     func(bit int) string
}

// reloadDatapathSettings is TestIPTablesReloadDatapathSettings's body in
// mode m: one agent, its config file edited five times (one of them a
// bad edit), the rules and pod b's connections to the ClusterIP and the
// client's to the NodePort checked after each.
func reloadDatapathSettings(t *testing.T, m reloadMode) {
	bin := rootAgent(t, m.binaries...)

	node := netns.NewNode(t, "node")
	a, b := node.AddPod("a"), node.AddPod("b")
	client := node.AddClient("client")
	serve(t, a)
	ma := newManifestsAgent(t)
	ma.manifest(t, "web.yaml", webManifest(a.IP, nodeName))
	// Each step's settings after the same sync settings.
	config := func(extra string) {
		t.Helper()
		writeFile(t, ma.cfg, strings.Replace(ma.config("sync: {minPeriod: 200ms, period: 30s}\n"+extra), "mode: iptables\n", "mode: "+m.mode+"\n", 1))
	}
	config("clusterCIDR: 10.244.0.0/16\n")
	logOnFailure(t, node, m.list[0], m.list[1:]...)
	ag := ma.start(t, node, bin)
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
	rules := func() string {
		t.Helper()
		out, err := node.Run(m.list[0], m.list[1:]...)
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
	if r := rules(); !strings.Contains(r, m.mark(12)) || strings.Contains(r, m.mark(14)) {
		t.Fatalf("rules after masqueradeBit 14 -> 12: want mark %s only:\n%s", m.mark(12), r)
	}

	// A bad edit is refused whole: the rules stay.
	before := rules()
	config("clusterCIDR: 10.244.0.0/16\nmasqueradeAll: false\niptables: {masqueradeBit: 40}\n")
	waitFor(t, 30*time.Second, "the bad edit logged", func() error {
		out, _ := os.ReadFile(ag.log)
		if !strings.Contains(string(out), "iptables.masqueradeBit") {
			return fmt.Errorf("no refusal naming iptables.masqueradeBit in the log")
		}
		return nil
	})
	time.Sleep(time.Second) // a sync the edit would have caused (minPeriod 200ms)
	if after := rules(); stripCounters(after) != stripCounters(before) {
		t.Fatalf("a refused edit changed the rules:\n--- before\n%s\n--- after\n%s", before, after)
	}
	seen("b -> ClusterIP after the refused edit: still masqueraded", node.Gateway)

	// A clusterCIDR that b is not in: masqueraded without masqueradeAll;
	// node ports on no address of the node's.
	config("clusterCIDR: 10.250.0.0/16\nnodePortAddresses: [10.99.0.0/16]\n")
	waitFor(t, 30*time.Second, "mark "+m.mark(14)+" and 10.250.0.0/16 in the rules", func() error {
		if r := rules(); !strings.Contains(r, m.mark(14)) || !strings.Contains(r, "10.250.0.0/16") {
			return fmt.Errorf("not yet:\n%s", r)
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
	if out, _ := os.ReadFile(ag.log); !strings.Contains(string(out), "datapath settings changed") {
		t.Errorf("the agent never logged a datapath settings change")
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
