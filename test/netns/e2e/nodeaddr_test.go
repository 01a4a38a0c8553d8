package e2e_test

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// The node's address changes while edgeproxy runs, as when DHCP at an
// edge site renews with another lease and the kubelet writes the new
// address into the Node's InternalIP: NodePorts with nodePortAddresses
// [primary] follow the Node. Until the Node says so, the new address is
// not a NodePort address (primary is what the Node lists), and the old
// one is no longer the node's.
//
// kube-proxy v1.36 does not follow: its NodeManager logs "NodeIPs changed
// for the node" and keeps the addresses it started with (the exit after
// it is a FIXME in pkg/proxy/node.go), so this is not a conformance
// matrix cell (the matrix compares the two proxies, each started once per
// profile) but edgeproxy's own test; DIFFERENCES.md says why.
func TestNodeAddressChangeFollowed(t *testing.T) {
	bin := rootAgent(t, "iptables", "iptables-restore", "iptables-save")

	node := netns.NewNode(t, "node")
	p := node.AddPod("p")
	client := node.AddClient("client")
	serve(t, p)
	w := newAPIWorld(t, node, "addr", 5*time.Minute)
	labels := map[string]string{"app": "web"}
	w.readyPod(t, "p", p, labels, podPorts(false))
	svc := clusterIPService("web", netip.MustParseAddr("10.96.0.50"), labels, servicePort("tcp", corev1.ProtocolTCP, 80, podPort))
	svc.Spec.Type = corev1.ServiceTypeNodePort
	svc.Spec.Ports[0].NodePort = 30080
	w.createService(t, svc)
	dir, cfg := apiAgentConfig(t, w, "nodePortAddresses: [primary]\n")
	startAgent(t, node, bin, cfg, filepath.Join(dir, "agent.log"))
	logOnFailure(t, node, "iptables-save", "-t", "nat")

	reach := func(a netip.Addr) error {
		r, err := client.TCP(netip.AddrPortFrom(a, 30080), 2*time.Second)
		if err == nil && r.Name != "p" {
			err = fmt.Errorf("%s:30080 answered by %s", a, r.Name)
		}
		return err
	}
	old, renewed := node.LinkIP, netip.MustParseAddr("192.168.77.5")
	waitFor(t, time.Minute, "the NodePort on the node's first address", func() error { return reach(old) })

	// The new lease: its address on the link, the old one gone (the new
	// one kept: promote_secondaries), the client's route through it.
	nl, cl := node.Netlink(), client.Netlink()
	link, err := nl.LinkByName("c-client")
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Sysctl("net/ipv4/conf/c-client/promote_secondaries", "1"); err != nil {
		t.Fatal(err)
	}
	if err := nl.AddrAdd(link, &netlink.Addr{IPNet: ipnetOf(netip.PrefixFrom(renewed, 24))}); err != nil {
		t.Fatal(err)
	}
	if err := nl.AddrDel(link, &netlink.Addr{IPNet: ipnetOf(netip.PrefixFrom(old, 24))}); err != nil {
		t.Fatal(err)
	}
	eth, err := cl.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.RouteReplace(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: renewed.AsSlice()}); err != nil {
		t.Fatal(err)
	}
	// The Node still lists the old address: the new one is no NodePort
	// address yet, the node's kernel refuses it.
	if err := reach(renewed); err == nil {
		t.Fatalf("%s:30080 answered before the Node listed it (nodePortAddresses [primary])", renewed)
	}

	// The kubelet writes the new address into the Node.
	n, err := w.c.Client().CoreV1().Nodes().Get(w.ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP && a.Address == old.String() {
			n.Status.Addresses[i].Address = renewed.String()
		}
	}
	if _, err := w.c.Client().CoreV1().Nodes().UpdateStatus(w.ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the NodePort on the node's renewed address", func() error { return reach(renewed) })
}

func ipnetOf(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
