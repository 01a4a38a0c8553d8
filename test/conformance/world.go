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
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
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

// populate creates the Nodes, Pods and Services and waits for the
// EndpointSlice controller to have written every Service's slices.
func (w *World) populate(ctx context.Context) error {
	c := w.Cluster
	addrs := podAddrs()
	if err := c.CreateNamespace(ctx, namespace); err != nil {
		return err
	}
	nodes := []struct {
		name string
		ips  []netip.Addr
	}{
		{NodeName, []netip.Addr{nodeIP4, nodeIP6}},
		{"node-b", []netip.Addr{remoteNode4, remoteNode6}},
		{"node-c", []netip.Addr{nodeC4, nodeC6}},
		{"node-d", []netip.Addr{nodeD4, nodeD6}},
	}
	for _, n := range nodes {
		node, err := c.CreateNode(ctx, n.name, nodeZones[n.name], n.ips[0].String(), n.ips[1].String())
		if err != nil {
			return err
		}
		if nodeZones[n.name] == "" {
			// No zone at all, not an empty one.
			delete(node.Labels, cluster.ZoneLabel)
			if _, err := w.Client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("node %s without a zone: %w", n.name, err)
			}
		}
	}
	for name, ip := range addrs {
		if name == "outpod" {
			continue
		}
		node := NodeName
		if r, ok := remotePods[name]; ok {
			node = r
		}
		labels := map[string]string{}
		for _, s := range Shapes {
			if slices.Contains(s.Pods, name) {
				labels["s-"+s.Name] = "y"
			}
		}
		if _, err := c.CreateReadyPodIPs(ctx, namespace, name, node, []string{ip[0].String(), ip[1].String()}, labels, podPorts[name]); err != nil {
			return err
		}
		if notReady[name] {
			if err := c.SetPodReady(ctx, namespace, name, false); err != nil {
				return err
			}
		}
		if terminal[name] {
			// No kubelet: the Pod stays terminating, not ready, and serving
			// as long as its Ready condition is true (not tn).
			grace := int64(3600)
			if err := w.Client.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
				return fmt.Errorf("terminate pod %s: %w", name, err)
			}
		}
	}
	if err := w.otherNamespaces(ctx); err != nil {
		return err
	}
	for i := range Shapes {
		s := &Shapes[i]
		svc, err := w.createService(ctx, s, nil)
		if err != nil {
			return err
		}
		w.setService(s.Name, svc)
	}
	w.nameServices()
	return w.waitSlices(ctx)
}

// otherNamespaces creates the namespaces of shapes that name one, each
// with Pod objects for the pods its shapes select: the same pods (name,
// node, addresses) as in namespace, since a Service selects Pods of its
// own namespace only.
func (w *World) otherNamespaces(ctx context.Context) error {
	addrs := podAddrs()
	pods := map[string]map[string]map[string]string{} // namespace → pod → labels
	for _, s := range Shapes {
		if s.ns() == namespace {
			continue
		}
		if pods[s.ns()] == nil {
			pods[s.ns()] = map[string]map[string]string{}
		}
		for _, p := range s.Pods {
			if terminal[p] || notReady[p] {
				return fmt.Errorf("shape %s: pod %s: only ready pods are made in another namespace", s.Name, p)
			}
			if pods[s.ns()][p] == nil {
				pods[s.ns()][p] = map[string]string{}
			}
			pods[s.ns()][p]["s-"+s.Name] = "y"
		}
	}
	for _, ns := range slices.Sorted(maps.Keys(pods)) {
		if err := w.Cluster.CreateNamespace(ctx, ns); err != nil {
			return err
		}
		for _, name := range slices.Sorted(maps.Keys(pods[ns])) {
			node := NodeName
			if r, ok := remotePods[name]; ok {
				node = r
			}
			ip := addrs[name]
			if _, err := w.Cluster.CreateReadyPodIPs(ctx, ns, name, node, []string{ip[0].String(), ip[1].String()}, pods[ns][name], podPorts[name]); err != nil {
				return err
			}
		}
	}
	return nil
}

// createService creates the shape's Service; with prev (the one a change
// cell deleted), at prev's addresses and NodePorts.
func (w *World) createService(ctx context.Context, s *Shape, prev *corev1.Service) (*corev1.Service, error) {
	client := w.Client.CoreV1().Services(s.ns())
	policy := map[string]corev1.IPFamilyPolicy{"dual": corev1.IPFamilyPolicyPreferDualStack, "v4": corev1.IPFamilyPolicySingleStack, "v6": corev1.IPFamilyPolicySingleStack}[s.Families]
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.ns(), Name: s.svcName()},
		Spec: corev1.ServiceSpec{
			Type:           s.Type,
			Selector:       map[string]string{"s-" + s.Name: "y"},
			IPFamilyPolicy: &policy,
		},
	}
	for _, p := range s.ports() {
		target := intstr.FromInt32(targetPort)
		if p.Target != "" {
			target = intstr.FromString(p.Target)
		}
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: p.Name, Port: p.Port, TargetPort: target, Protocol: p.Proto})
	}
	switch s.Families {
	case "v4":
		svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol}
	case "v6":
		svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
	}
	if s.ETP == "Local" && s.Type != cip {
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	if s.ETP == "Local" && s.Type == cip && s.ExternalIPs {
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	if s.ITP == "Local" {
		local := corev1.ServiceInternalTrafficPolicyLocal
		svc.Spec.InternalTrafficPolicy = &local
	}
	if s.Affinity {
		svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	}
	if s.AffinityTimeout > 0 {
		timeout := s.AffinityTimeout
		svc.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout}}
	}
	if s.Traffic != "" {
		svc.Spec.TrafficDistribution = &s.Traffic
	}
	if s.ExternalIPs {
		for _, a := range s.externalIPs() {
			svc.Spec.ExternalIPs = append(svc.Spec.ExternalIPs, a.String())
		}
	}
	switch s.SourceRange {
	case SourceClient:
		svc.Spec.LoadBalancerSourceRanges = []string{netip.PrefixFrom(client4, 32).String(), netip.PrefixFrom(client6, 128).String()}
	case SourceNode:
		svc.Spec.LoadBalancerSourceRanges = []string{netip.PrefixFrom(nodeIP4, 32).String(), netip.PrefixFrom(nodeIP6, 128).String()}
	}
	if prev != nil {
		svc.Spec.ClusterIP, svc.Spec.ClusterIPs, svc.Spec.IPFamilies = prev.Spec.ClusterIP, prev.Spec.ClusterIPs, prev.Spec.IPFamilies
		for i := range svc.Spec.Ports {
			svc.Spec.Ports[i].NodePort = prev.Spec.Ports[i].NodePort
		}
	}
	created, err := client.Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create service %s: %w", s.Name, err)
	}
	if s.Type != lb {
		return created, nil
	}
	mode := corev1.LoadBalancerIPModeVIP
	if s.IPModeProxy {
		mode = corev1.LoadBalancerIPModeProxy
	}
	for _, a := range s.lbIPs() {
		created.Status.LoadBalancer.Ingress = append(created.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: a.String(), IPMode: &mode})
	}
	updated, err := client.UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("service %s: load balancer status: %w", s.Name, err)
	}
	return updated, nil
}

// waitSlices waits until every Service's slices list exactly its pods,
// and those of a Service with a trafficDistribution carry the zone hints
// the controller writes for it.
func (w *World) waitSlices(ctx context.Context) error {
	for _, s := range Shapes {
		if err := w.waitEndpoints(ctx, s.Name, s.Pods); err != nil {
			return err
		}
		if s.Traffic != "" {
			if err := w.waitHints(ctx, s.Name, s.Traffic == string(corev1.ServiceTrafficDistributionPreferSameNode)); err != nil {
				return err
			}
		}
	}
	return nil
}

// nodeZones are the zones of the world's Nodes (populate).
var nodeZones = map[string]string{NodeName: "zone-a", "node-b": "zone-b", "node-c": "zone-a", "node-d": ""}

// waitHints waits (bounded) until every endpoint of the Service of shape
// name carries the hint the EndpointSlice controller writes for
// trafficDistribution: for its own zone, the zone of its pod's Node, and
// with forNodes (PreferSameNode) for that Node too. Without them both
// proxies would send to every endpoint, and the zone cells would match for
// nothing; this is the world's half of their anchor.
func (w *World) waitHints(ctx context.Context, name string, forNodes bool) error {
	var last string
	s := shape(name)
	err := cluster.WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		list, err := w.Client.DiscoveryV1().EndpointSlices(s.ns()).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + s.svcName()})
		if err != nil || len(list.Items) == 0 {
			last = fmt.Sprintf("no slices (%v)", err)
			return false, nil
		}
		for _, sl := range list.Items {
			for _, e := range sl.Endpoints {
				node := ""
				if e.NodeName != nil {
					node = *e.NodeName
				}
				zone := nodeZones[node]
				if zone == "" {
					// The controller hints no endpoint whose Node has no zone.
					if e.Hints != nil {
						last = fmt.Sprintf("endpoint %v on %q (no zone): hints %+v, want none", e.Addresses, node, e.Hints)
						return false, nil
					}
					continue
				}
				if e.Hints == nil || len(e.Hints.ForZones) != 1 || e.Hints.ForZones[0].Name != zone {
					last = fmt.Sprintf("endpoint %v on %q: hints %+v, want for zone %q", e.Addresses, node, e.Hints, zone)
					return false, nil
				}
				if forNodes && (len(e.Hints.ForNodes) != 1 || e.Hints.ForNodes[0].Name != node) {
					last = fmt.Sprintf("endpoint %v on %q: hints %+v, want for node %q", e.Addresses, node, e.Hints, node)
					return false, nil
				}
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("zone hints of %s (%s): %w", name, last, err)
	}
	return nil
}

// waitEndpoints waits until the slices of the Service of shape name hold
// exactly the addresses of pods (both families).
func (w *World) waitEndpoints(ctx context.Context, name string, pods []string) error {
	want := map[string]bool{}
	svc := w.service(name)
	s := shape(name)
	addrs := podAddrs()
	for _, p := range pods {
		for _, f := range svc.Spec.IPFamilies {
			if f == corev1.IPv4Protocol {
				want[addrs[p][0].String()] = true
			} else {
				want[addrs[p][1].String()] = true
			}
		}
	}
	err := cluster.WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		list, err := w.Client.DiscoveryV1().EndpointSlices(s.ns()).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + s.svcName()})
		if err != nil {
			return false, nil
		}
		got := map[string]bool{}
		for _, sl := range list.Items {
			for _, e := range sl.Endpoints {
				for _, a := range e.Addresses {
					got[a] = true
				}
			}
		}
		if len(got) != len(want) {
			return false, nil
		}
		for a := range want {
			if !got[a] {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("endpoints of %s: want %v: %w", name, pods, err)
	}
	return nil
}

// service is the Service of shape name.
func (w *World) service(name string) *corev1.Service {
	w.svcMu.RLock()
	defer w.svcMu.RUnlock()
	return w.Services[name]
}

func (w *World) setService(name string, svc *corev1.Service) {
	w.svcMu.Lock()
	defer w.svcMu.Unlock()
	w.Services[name] = svc
}

// applyChange makes a change shape's change (forward) or puts it back,
// and waits until the Service's slices show it. A deleted Service comes
// back at its addresses and NodePorts; until then the cells send to them.
func (w *World) applyChange(ctx context.Context, s *Shape, forward bool) error {
	switch s.Change {
	case ChangeReplace:
		from, to := "sa", "sb"
		if !forward {
			from, to = to, from
		}
		// The old endpoint leaves before the new one joins: the Service
		// passes through no endpoints, never through both, so a new flow
		// that reaches the new one shows a proxy that no longer has the
		// old one (with both, kube-proxy IPVS's rr sent every other new
		// flow to sb while its next sync, slow in the VM, had yet to
		// remove sa: the old flow was judged before that).
		if err := w.setLabel(ctx, s.Name, from, false); err != nil {
			return err
		}
		if err := w.setLabel(ctx, s.Name, to, true); err != nil {
			return err
		}
		return w.waitEndpoints(ctx, s.Name, []string{to})
	case ChangeAdd, ChangeRemove:
		on := forward == (s.Change == ChangeAdd)
		if err := w.setLabel(ctx, s.Name, "sa", on); err != nil {
			return err
		}
		if on {
			return w.waitEndpoints(ctx, s.Name, []string{"sa"})
		}
		return w.waitEndpoints(ctx, s.Name, nil)
	case ChangeDelete:
		if forward {
			if err := w.Client.CoreV1().Services(s.ns()).Delete(ctx, s.svcName(), metav1.DeleteOptions{}); err != nil {
				return fmt.Errorf("delete service %s: %w", s.Name, err)
			}
			return nil
		}
		// The addresses and NodePorts are free again once the delete is
		// done; a create that comes first is retried (bounded).
		var last error
		err := cluster.WaitFor(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
			svc, err := w.createService(ctx, s, w.service(s.Name))
			if err != nil {
				last = err
				return false, nil
			}
			w.setService(s.Name, svc)
			return true, nil
		})
		if err != nil {
			return fmt.Errorf("recreate service %s: %v: %w", s.Name, last, err)
		}
		return w.waitEndpoints(ctx, s.Name, s.Pods)
	case ChangePort:
		port := int32(changedPort)
		if !forward {
			port = servicePort
		}
		svc := w.service(s.Name).DeepCopy()
		svc.Spec.Ports[0].Port = port
		updated, err := w.Client.CoreV1().Services(s.ns()).Update(ctx, svc, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("service %s: port %d: %w", s.Name, port, err)
		}
		w.setService(s.Name, updated)
		return nil
	}
	return fmt.Errorf("shape %s: unknown change %q", s.Name, s.Change)
}

// setLabel puts pod in (on) or out of the selector of the Service of
// shape.
func (w *World) setLabel(ctx context.Context, shape, pod string, on bool) error {
	value := `"y"`
	if !on {
		value = "null"
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, "s-"+shape, value)
	if _, err := w.Client.CoreV1().Pods(namespace).Patch(ctx, pod, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("label pod %s for %s: %w", pod, shape, err)
	}
	return nil
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
