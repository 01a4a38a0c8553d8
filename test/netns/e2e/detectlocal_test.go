package e2e_test

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
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
