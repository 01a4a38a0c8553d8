// Package detectlocalguest is the guest half of test/vm's
// TestDetectLocalIPVS: kube-proxy --proxy-mode=ipvs and edgeproxy mode
// ipvs, one after the other, with each local-traffic detection setting,
// probed from five positions (test/netns/e2e's
// TestDetectLocalAgainstKubeProxy, in IPVS mode: the host's kernel has no
// IPVS). This file holds what both halves share: the world's names and
// addresses and the setup the host hands the guest.
package detectlocalguest

import "net/netip"

// The world: one node (the guest's netns.NewNode, its client link at
// NodeIP and NodeIP6) with pod ranges PodCIDRs, pods a and b in that
// order (b at BIPs), and the dual-stack NodePort Service web on b, TCP and
// UDP, port 80 (NodePort NodePort) to PodPort.
const (
	Namespace = "detect"
	NodeName  = "node1"
	PodPort   = 8080
	NodePort  = 30080
)

var (
	NodeIP   = netip.MustParseAddr("192.168.77.1") // netns.Node.LinkIP once a client is added
	NodeIP6  = netip.MustParseAddr("fd00:77::1")   // netns.Node.LinkIP6
	VIP      = netip.MustParseAddr("10.96.100.10")
	VIP6     = netip.MustParseAddr("fd00:96::10")
	BIPs     = []netip.Addr{netip.MustParseAddr("10.244.0.3"), netip.MustParseAddr("fd00:244::3")}
	PodCIDRs = []string{"10.244.0.0/24", "fd00:244::/64"} // the Node's, as netns.NewNode's bridge
)

// ServiceCIDR is the API server's dual-stack Service range.
const ServiceCIDR = "10.96.0.0/16,fd00:96::/112"

// Setup is setup.json in the shared directory.
type Setup struct {
	KubeProxy string // the kube-proxy binary (readable in the guest)
	EdgeProxy string // the edgeproxy binary, copied into the shared directory
	APIPort   int    // the API server's port on the host's loopback (10.0.2.2 from the guest)
}
