package conformance

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/test/cluster"
)

const (
	// NodeName is the Node both proxies run as.
	NodeName    = "node-a"
	namespace   = "conformance"
	servicePort = 80
	targetPort  = 8080
	// ClusterCIDR covers both nodes' pods (10.244.0.0/24, 10.244.1.0/24)
	// but not the outside pod (10.99.0.2).
	ClusterCIDR = "10.244.0.0/16,fd00:244::/48"
	serviceCIDR = "10.96.0.0/16,fd00:96::/112"
)

// Addresses of the node-to-node link and of the remote node.
var (
	nodeRemote4   = netip.MustParseAddr("192.168.78.1")
	nodeRemote6   = netip.MustParseAddr("fd00:78::1")
	remoteNode4   = netip.MustParseAddr("192.168.78.2")
	remoteNode6   = netip.MustParseAddr("fd00:78::2")
	nodeC4        = netip.MustParseAddr("192.168.78.3") // node-c's object only
	nodeC6        = netip.MustParseAddr("fd00:78::3")
	nodeD4        = netip.MustParseAddr("192.168.78.4") // node-d's object only
	nodeD6        = netip.MustParseAddr("fd00:78::4")
	remotePodNet  = netip.MustParsePrefix("10.244.1.0/24")
	remotePodNet6 = netip.MustParsePrefix("fd00:244:1::/64")
)

// The node's InternalIPs (its address on the client link, netns.AddClient).
var (
	nodeIP4 = netip.MustParseAddr("192.168.77.1")
	nodeIP6 = netip.MustParseAddr("fd00:77::1")
)

// hostDaemonPort is where the node's own daemon listens on every address
// (0.0.0.0 and ::): a port no Service uses, for the host-port cells.
const hostDaemonPort = 9099

// hostDaemon is the name the node's daemon answers with.
const hostDaemon = "node-daemon"

// World is the fixed part of the matrix: the control plane, the namespaces
// and their pods, the Services. Its two halves can live apart: the API
// objects (populate) and the namespaces (newNet) agree on every address by
// construction (podAddrs), so the VM run builds the namespaces in the
// guest against objects the host created.
type World struct {
	t       testing.TB
	Cluster *cluster.Cluster // on the host side only
	// Client reaches the API server from where the test runs.
	Client kubernetes.Interface
	Node   *netns.Node
	Remote *netns.Node
	Ext    *netns.NS
	Pods   map[string]*netns.Pod
	// Kubeconfig reaches the API server from inside the node.
	Kubeconfig string
	Dir        string
	// Services by shape name, as the API server returned them (with
	// ClusterIPs, NodePorts, healthCheckNodePort). While the change cells
	// run (each shape in a goroutine) it is read with service and written
	// with setService only.
	Services map[string]*corev1.Service
	svcMu    sync.RWMutex
	// names maps every address of the world to a name, for outcomes.
	names map[netip.Addr]string
	// probes and timeout bound each cell (maxProbes, probeTimeout).
	probes  int
	timeout time.Duration
	// nextPort counts the probes' source ports (see send).
	nextPort atomic.Uint32
}

// podAddrs are the pods' addresses: local pods in the node's pod network
// in localPods order, remote pods in node-b's in name order, outpod
// outside clusterCIDR.
func podAddrs() map[string][2]netip.Addr {
	out := map[string][2]netip.Addr{"outpod": {outside4, outside6}}
	nets := []struct {
		names  []string
		p4, p6 netip.Prefix
	}{
		{localPods, netip.MustParsePrefix("10.244.0.0/24"), netip.MustParsePrefix("fd00:244::/64")},
		{slices.Sorted(maps.Keys(remotePods)), remotePodNet, remotePodNet6},
	}
	for _, n := range nets {
		for i, name := range n.names {
			a4, a6 := n.p4.Addr().As4(), n.p6.Addr().As16()
			a4[3], a6[15] = byte(2+i), byte(2+i)
			out[name] = [2]netip.Addr{netip.AddrFrom4(a4), netip.AddrFrom16(a6)}
		}
	}
	return out
}

// NewWorld builds the whole world on this machine (the iptables matrix);
// everything goes when t ends.
func NewWorld(ctx context.Context, t testing.TB) *World {
	t.Helper()
	w := newNet(t)
	host, nodeHost := w.Node.LinkHost()
	w.names[nodeHost] = "node/host-link"
	w.Cluster = cluster.New(t, cluster.Options{BindAddress: host.String(), ServiceCIDR: serviceCIDR, Dir: filepath.Join(w.Dir, "cluster")})
	w.Client = w.Cluster.Client()
	w.Kubeconfig = filepath.Join(w.Dir, "node.kubeconfig")
	if err := w.Cluster.WriteKubeconfig(w.Kubeconfig, fmt.Sprintf("https://%s:%d", host, w.Cluster.Port())); err != nil {
		t.Fatal(err)
	}
	if err := w.populate(ctx); err != nil {
		t.Fatal(err)
	}
	return w
}

// newNet builds the namespaces: the node with its pods, client and host
// daemon, node-b with its pods, the link between them.
func newNet(t testing.TB) *World {
	t.Helper()
	w := &World{t: t, Dir: t.TempDir(), Pods: map[string]*netns.Pod{}, Services: map[string]*corev1.Service{}, names: map[netip.Addr]string{},
		probes: maxProbes, timeout: probeTimeout}
	w.Node = netns.NewNode(t, "node")
	w.Ext = w.Node.AddClient("ext")
	if w.Node.LinkIP != nodeIP4 || w.Node.LinkIP6 != nodeIP6 {
		t.Fatalf("node addresses %s, %s: want %s, %s", w.Node.LinkIP, w.Node.LinkIP6, nodeIP4, nodeIP6)
	}
	w.Remote = netns.NewNodeNets(t, "remote", remotePodNet, remotePodNet6)
	w.linkRemote()

	addrs := podAddrs()
	for _, name := range localPods {
		w.Pods[name] = w.Node.AddPodAddrs(name, addrs[name][0], addrs[name][1])
	}
	w.Pods["outpod"] = w.Node.AddPodAddrs("outpod", outside4, outside6)
	for _, name := range slices.Sorted(maps.Keys(remotePods)) {
		w.Pods[name] = w.Remote.AddPodAddrs(name, addrs[name][0], addrs[name][1])
	}
	// Refusals are ICMP errors: without a rate limit every probe gets its
	// own, however many run at once.
	for _, n := range []*netns.NS{w.Node.NS, w.Remote.NS, w.Ext} {
		for _, k := range []string{"net/ipv4/icmp_ratelimit", "net/ipv6/icmp/ratelimit"} {
			if err := n.Sysctl(k, "0"); err != nil {
				t.Fatalf("%s: %v", k, err)
			}
		}
	}
	// No TIME_WAIT sockets (netns.NoTimeWait): in the first runs with the
	// probe that sees SYN resends, 24 of 1,434 cells showed one, every one
	// masqueraded, in either proxy's column at random. The stall is the
	// world's, not a proxy's: without the sockets, a SYN a proxy drops
	// still shows. In the VM, without the long fin timeout, a probe's
	// connect failed with EPIPE.
	for _, n := range append([]*netns.NS{w.Node.NS, w.Remote.NS, w.Ext}, podNS(w.Pods)...) {
		if err := n.NoTimeWait(); err != nil {
			t.Fatal(err)
		}
	}
	for name, p := range w.Pods {
		w.names[p.IP], w.names[p.IP6] = name, name
		if name == "outpod" {
			continue
		}
		if err := p.Serve(targetPort); err != nil {
			t.Fatal(err)
		}
		// Named ports: Serve answers both protocols, once per number.
		served := map[int32]bool{targetPort: true}
		for _, cp := range podPorts[name] {
			if !served[cp.ContainerPort] {
				served[cp.ContainerPort] = true
				if err := p.Serve(uint16(cp.ContainerPort)); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	// The node's own daemon, on every address, for the host-port cells.
	daemon := &netns.Pod{NS: w.Node.NS, PodName: hostDaemon}
	if err := daemon.Serve(hostDaemonPort); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(daemon.Stop)
	// It answers on the node's own addresses: the host-port cells, where
	// no proxy lets it answer, would otherwise not tell a dead daemon.
	for _, a := range []netip.Addr{nodeIP4, nodeIP6} {
		r, err := w.Ext.TCP(netip.AddrPortFrom(a, hostDaemonPort), 10*time.Second)
		if err != nil || r.Name != hostDaemon {
			t.Fatalf("node daemon on %s: %+v, %v", a, r, err)
		}
	}
	w.loopbackToNode()
	for a, n := range map[netip.Addr]string{
		w.Node.Gateway: "node/br", w.Node.Gateway6: "node/br",
		w.Node.LinkIP: "node/ext-link", w.Node.LinkIP6: "node/ext-link",
		nodeRemote4: "node/remote-link", nodeRemote6: "node/remote-link",
		client4: "ext", client6: "ext",
		w.Remote.Gateway: "node-b/br", w.Remote.Gateway6: "node-b/br",
		remoteNode4: "node-b", remoteNode6: "node-b",
		netip.MustParseAddr("127.0.0.1"): "node/lo",
	} {
		w.names[a] = n
	}
	return w
}

// loopbackToNode routes the outside client's 127.0.0.1 to the node's
// address on their link, for the CVE-2020-8558 cells (a neighbour sending
// to 127.0.0.1:<port> of a node whose route_localnet is on): its own
// loopback routes go, and its link takes replies from 127.0.0.1
// (route_localnet, accept_local: the address is still on its lo). It then
// checks the path: with the node's route_localnet on and no proxy, the
// node's daemon answers there; the cells' timeouts are the proxies' drops,
// not a world that never delivers.
func (w *World) loopbackToNode() {
	t := w.t
	for _, args := range [][]string{
		{"route", "del", "local", "127.0.0.0/8", "dev", "lo", "table", "local"},
		{"route", "del", "local", "127.0.0.1", "dev", "lo", "table", "local"},
		{"route", "add", "127.0.0.1/32", "via", nodeIP4.String(), "dev", "eth0"},
	} {
		if out, err := w.Ext.Run("ip", args...); err != nil {
			t.Fatalf("ext: ip %v: %v: %s", args, err, out)
		}
	}
	for _, k := range []string{"net/ipv4/conf/eth0/route_localnet", "net/ipv4/conf/eth0/accept_local"} {
		if err := w.Ext.Sysctl(k, "1"); err != nil {
			t.Fatalf("ext: %s: %v", k, err)
		}
	}
	const localnet = "net/ipv4/conf/all/route_localnet"
	if err := w.Node.Sysctl(localnet, "1"); err != nil {
		t.Fatal(err)
	}
	r, err := w.Ext.TCP(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), hostDaemonPort), 10*time.Second)
	if err := w.Node.Sysctl(localnet, "0"); err != nil {
		t.Fatal(err)
	}
	if err != nil || r.Name != hostDaemon || r.Client.Addr() != client4 {
		t.Fatalf("node daemon on 127.0.0.1 from the outside client, route_localnet on: %+v, %v", r, err)
	}
}

func podNS(pods map[string]*netns.Pod) []*netns.NS {
	var out []*netns.NS
	for _, name := range slices.Sorted(maps.Keys(pods)) {
		out = append(out, pods[name].NS)
	}
	return out
}

// linkRemote wires node-b's namespace to the node: 192.168.78.0/24 and
// fd00:78::/64, with routes to node-b's pods through it and node-b's
// default route through the node.
func (w *World) linkRemote() {
	t := w.t
	nl, rl := w.Node.Netlink(), w.Remote.Netlink()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "to-node-b"}, PeerName: "to-node-a", PeerNamespace: netlink.NsFd(w.Remote.Handle())}
	if err := nl.LinkAdd(veth); err != nil {
		t.Fatalf("link node-b: %v", err)
	}
	for _, side := range []struct {
		h      *netlink.Handle
		name   string
		a4, a6 netip.Addr
	}{{nl, "to-node-b", nodeRemote4, nodeRemote6}, {rl, "to-node-a", remoteNode4, remoteNode6}} {
		l, err := side.h.LinkByName(side.name)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []netip.Prefix{netip.PrefixFrom(side.a4, 24), netip.PrefixFrom(side.a6, 64)} {
			if err := side.h.AddrAdd(l, &netlink.Addr{IPNet: ipnet(p), Flags: unix.IFA_F_NODAD}); err != nil {
				t.Fatalf("address %s on %s: %v", p, side.name, err)
			}
		}
		if err := side.h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	routes := []struct {
		h   *netlink.Handle
		dst netip.Prefix
		gw  netip.Addr
	}{
		{nl, remotePodNet, remoteNode4}, {nl, remotePodNet6, remoteNode6},
		{rl, netip.PrefixFrom(netip.IPv4Unspecified(), 0), nodeRemote4},
		{rl, netip.PrefixFrom(netip.IPv6Unspecified(), 0), nodeRemote6},
	}
	for _, r := range routes {
		if err := r.h.RouteAdd(&netlink.Route{Dst: ipnet(r.dst), Gw: r.gw.AsSlice()}); err != nil {
			t.Fatalf("route %s via %s: %v", r.dst, r.gw, err)
		}
	}
}

func ipnet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// nameServices names the Services' addresses, which an endpoint sees as
// the source when the node reaches a Service address that is its own
// (IPVS mode's dummy link): "<shape>/clusterip", "<shape>/lb",
// "<shape>/extip". The addresses differ from one world to the next; the
// names do not.
func (w *World) nameServices() {
	for name, svc := range w.Services {
		for _, a := range svc.Spec.ClusterIPs {
			w.nameAddr(a, name+"/clusterip")
		}
		for _, in := range svc.Status.LoadBalancer.Ingress {
			w.nameAddr(in.IP, name+"/lb")
		}
		for _, a := range svc.Spec.ExternalIPs {
			w.nameAddr(a, name+"/extip")
		}
	}
}

func (w *World) nameAddr(s, name string) {
	if a, err := netip.ParseAddr(s); err == nil {
		w.names[a] = name
	}
}

// name is an address's name in outcomes: a pod, the client, a node
// address; the address itself when unknown.
func (w *World) name(a netip.Addr) string {
	if n, ok := w.names[a.Unmap()]; ok {
		return n
	}
	return a.String()
}

// nodeIPv6 are the node's global IPv6 addresses and their links' names.
var nodeIPv6 = []struct {
	link string
	addr netip.Prefix
}{
	{"br0", netip.MustParsePrefix("fd00:244::1/64")},
	{"c-ext", netip.PrefixFrom(nodeIP6, 64)},
	{"to-node-b", netip.PrefixFrom(nodeRemote6, 64)},
}

// withoutIPv6 takes the node's global IPv6 addresses away (profile
// noipv6): it keeps only link-local ones, as a node whose IPv6 has not
// come (or never comes) by SLAAC. Its neighbours keep their routes: the
// node answers neighbour discovery for its old addresses (proxy NDP) and
// keeps every IPv6 route it had, so that what an IPv6 cell shows is the
// proxy's. restore puts the addresses back.
func (w *World) withoutIPv6() (restore func() error, err error) {
	nl := w.Node.Netlink()
	// The routes of the node's own links (not of an IPVS dummy link the
	// next proxy's reset deletes).
	var routes []netlink.Route
	for _, a := range nodeIPv6 {
		l, err := nl.LinkByName(a.link)
		if err != nil {
			return nil, err
		}
		rs, err := nl.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_MAIN, LinkIndex: l.Attrs().Index}, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_OIF)
		if err != nil {
			return nil, fmt.Errorf("node routes on %s: %w", a.link, err)
		}
		routes = append(routes, rs...)
	}
	keep := func() error {
		var errs []error
		for _, r := range routes {
			if r.Dst != nil && (r.Dst.IP.IsLinkLocalUnicast() || r.Dst.IP.IsMulticast()) {
				continue
			}
			r := r
			if err := nl.RouteReplace(&r); err != nil {
				errs = append(errs, fmt.Errorf("route %s: %w", r, err))
			}
		}
		return errors.Join(errs...)
	}
	var errs []error
	for _, a := range nodeIPv6 {
		l, err := nl.LinkByName(a.link)
		if err != nil {
			return nil, err
		}
		addr := &netlink.Addr{IPNet: ipnet(a.addr), Flags: unix.IFA_F_NODAD}
		if err := nl.AddrDel(l, addr); err != nil {
			return nil, fmt.Errorf("address %s off %s: %w", a.addr, a.link, err)
		}
		for k, v := range map[string]string{"net/ipv6/conf/" + a.link + "/proxy_ndp": "1", "net/ipv6/neigh/" + a.link + "/proxy_delay": "0"} {
			errs = append(errs, w.Node.Sysctl(k, v))
		}
		errs = append(errs, nl.NeighAdd(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V6, Flags: netlink.NTF_PROXY, IP: a.addr.Addr().AsSlice()}))
	}
	errs = append(errs, keep())
	restore = func() error {
		var errs []error
		for _, a := range nodeIPv6 {
			l, err := nl.LinkByName(a.link)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			errs = append(errs, nl.NeighDel(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V6, Flags: netlink.NTF_PROXY, IP: a.addr.Addr().AsSlice()}))
			errs = append(errs, w.Node.Sysctl("net/ipv6/conf/"+a.link+"/proxy_ndp", "0"))
			if err := nl.AddrAdd(l, &netlink.Addr{IPNet: ipnet(a.addr), Flags: unix.IFA_F_NODAD}); err != nil {
				errs = append(errs, fmt.Errorf("address %s on %s: %w", a.addr, a.link, err))
			}
		}
		errs = append(errs, keep())
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("node IPv6 back: %w", err)
		}
		return nil
	}
	if err := errors.Join(errs...); err != nil {
		return nil, errors.Join(fmt.Errorf("node without IPv6: %w", err), restore())
	}
	// The addresses are gone: only link-local ones are left on the
	// node's links (a dummy link of the IPVS run before, emptied when the
	// next proxy starts, may still hold Service addresses).
	for _, a := range nodeIPv6 {
		l, err := nl.LinkByName(a.link)
		if err != nil {
			return nil, errors.Join(err, restore())
		}
		addrs, err := nl.AddrList(l, netlink.FAMILY_V6)
		if err != nil {
			return nil, errors.Join(err, restore())
		}
		for _, ad := range addrs {
			if !ad.IP.IsLinkLocalUnicast() {
				return nil, errors.Join(fmt.Errorf("node without IPv6: %s is left on %s", ad.IPNet, a.link), restore())
			}
		}
	}
	return restore, nil
}
