package e2e_test

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// ipv6Manifest is a single-stack IPv6 ClusterIP Service backed by the
// pod at ip.
func ipv6Manifest(ip netip.Addr) string {
	return tcpServiceManifest("web6", netip.MustParseAddr("fd00:96::10"), ip)
}

// linkLocalOnly takes the node's global IPv6 address off its pod bridge:
// the bridge keeps a link-local address (fe80::1), which the pods use as
// their IPv6 gateway, and a route to the pod range without an address of
// its own in it.
func linkLocalOnly(t *testing.T, node *netns.Node, pods ...*netns.Pod) {
	t.Helper()
	nl := node.Netlink()
	br, err := nl.LinkByName(node.Bridge)
	if err != nil {
		t.Fatal(err)
	}
	gw6 := &net.IPNet{IP: node.Gateway6.AsSlice(), Mask: net.CIDRMask(64, 128)}
	if err := nl.AddrDel(br, &netlink.Addr{IPNet: gw6}); err != nil {
		t.Fatalf("remove %s from the bridge: %v", node.Gateway6, err)
	}
	ll := net.ParseIP("fe80::1")
	if err := nl.AddrAdd(br, &netlink.Addr{IPNet: &net.IPNet{IP: ll, Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}); err != nil {
		t.Fatal(err)
	}
	podNet6 := &net.IPNet{IP: gw6.IP.Mask(gw6.Mask), Mask: gw6.Mask}
	if err := nl.RouteAdd(&netlink.Route{LinkIndex: br.Attrs().Index, Dst: podNet6}); err != nil {
		t.Fatalf("route to the IPv6 pod range: %v", err)
	}
	for _, p := range pods {
		pl, err := p.Netlink().LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		_ = p.Netlink().RouteDel(&netlink.Route{LinkIndex: pl.Attrs().Index, Gw: node.Gateway6.AsSlice(), Family: netlink.FAMILY_V6})
		if err := p.Netlink().RouteAdd(&netlink.Route{LinkIndex: pl.Attrs().Index, Gw: ll, Family: netlink.FAMILY_V6}); err != nil {
			t.Fatalf("%s: IPv6 default route through fe80::1: %v", p.PodName, err)
		}
	}
	addrs, err := nl.AddrList(nil, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ip, _ := netip.AddrFromSlice(a.IP); !ip.IsLoopback() && !ip.IsLinkLocalUnicast() {
			t.Fatalf("the node still has the IPv6 address %s", ip)
		}
	}
}

// An IPv6 Service is programmed on a node without a global IPv6 address
// (and an IPv4-only clusterCIDR), as kube-proxy programs it: IPv6 is
// proxied where the kernel has it on and ip6tables works (issue 26).
func TestIPTablesIPv6WithoutGlobalAddress(t *testing.T) {
	bin := rootAgent(t, "iptables", "iptables-restore", "ip6tables", "ip6tables-restore")

	node := netns.NewNode(t, "node")
	a, b := node.AddPod("a"), node.AddPod("b")
	serve(t, b)
	linkLocalOnly(t, node, a, b)
	// The pods reach each other over IPv6 through the node before the
	// agent runs: what fails later is the Service, not the network.
	if r, err := a.TCP(b.AddrPort6(podPort), 2*time.Second); err != nil || r.Name != "b" {
		t.Fatalf("a -> b over IPv6 through the link-local gateway: %+v %v", r, err)
	}

	m := newManifestsAgent(t)
	m.manifest(t, "web6.yaml", ipv6Manifest(b.IP6))
	m.writeConfig(t, defaultSettings)
	logOnFailure(t, node, "ip6tables-save")
	m.start(t, node, bin)

	vip := netip.AddrPortFrom(netip.MustParseAddr("fd00:96::10"), 80)
	waitFor(t, 60*time.Second, "a -> [fd00:96::10]:80 answered by b", func() error {
		r, err := a.TCP(vip, time.Second)
		if err == nil && (r.Name != "b" || r.Client.Addr() != a.IP6) {
			err = fmt.Errorf("got %+v, want b seeing %s", r, a.IP6)
		}
		return err
	})
}

// TestIPTablesKeepsIPv6ForwardingOff: on a node without a global IPv6
// address IPv6 Services are programmed, but IPv6 forwarding is left off
// when it is off: turning it on would make the node ignore Router
// Advertisements and drop the default routes they gave (a SLAAC node
// would lose its IPv6). IPv4 forwarding is turned on as always.
func TestIPTablesKeepsIPv6ForwardingOff(t *testing.T) {
	bin := rootAgent(t, "iptables", "iptables-restore", "ip6tables", "ip6tables-restore", "ip6tables-save")

	node := netns.NewNode(t, "node")
	b := node.AddPod("b")
	linkLocalOnly(t, node, b)
	for k, v := range map[string]string{"net/ipv6/conf/all/forwarding": "0", "net/ipv4/ip_forward": "0"} {
		if err := node.Sysctl(k, v); err != nil {
			t.Fatal(err)
		}
	}
	m := newManifestsAgent(t)
	m.manifest(t, "web6.yaml", ipv6Manifest(b.IP6))
	m.writeConfig(t, defaultSettings)
	m.start(t, node, bin)

	waitFor(t, 60*time.Second, "the IPv6 Service in ip6tables", func() error {
		out, err := node.Run("ip6tables-save", "-t", "nat")
		if err == nil && !strings.Contains(out, "e2e/web6:tcp") {
			err = fmt.Errorf("not programmed:\n%s", out)
		}
		return err
	})
	read := func(key string) string {
		var b []byte
		if err := node.Do(func() (err error) {
			b, err = os.ReadFile("/proc/sys/" + key)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if got := read("net/ipv6/conf/all/forwarding"); got != "0" {
		t.Errorf("net.ipv6.conf.all.forwarding = %s after the agent started, want it left at 0", got)
	}
	if got := read("net/ipv4/ip_forward"); got != "1" {
		t.Errorf("net.ipv4.ip_forward = %s, want the agent to turn it on", got)
	}
}
