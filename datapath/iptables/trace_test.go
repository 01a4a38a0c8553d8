package iptables

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// The packet-flow tests: a plan is synced into an xtables.Fake by the
// family's own sync, then first packets are traced through the tables
// (xtables.Fake.Trace) as the kernel would walk them. They need no root
// and say what the kernel tier says of the same rules in far less time;
// the kernel tier keeps what needs a kernel (conntrack, real replies,
// both backends' parsers, the tamper monitor).

// Addresses of the node the flows run on.
var (
	nodeIP4   = netip.MustParseAddr("192.168.1.10")
	nodeIP6   = netip.MustParseAddr("fd00:1::10")
	podCIDR4  = netip.MustParsePrefix("10.244.0.0/16")
	podCIDR6  = netip.MustParsePrefix("fd00:244::/64")
	outside4  = "203.0.113.5" // a client off the cluster
	outside6  = "2001:db8::5"
	localPod4 = "10.244.0.9" // a pod on this node, not an endpoint
)

// flow is one packet and what must become of it: want lists the outcome
// of every path, sorted, joined by ", ": "ADDR:PORT" for a DNAT
// (" masq" when masqueraded), "REJECT", "DROP", or "ACCEPT" (delivered
// or forwarded untouched; " local" when to the node itself).
type flow struct {
	name     string
	src, dst string
	proto    string
	port     uint16
	want     string
	iface    string // the interface the packet arrives on, if it matters
}

// syncedFake returns a Fake holding what one full sync of fs under cfg
// writes.
func syncedFake(t *testing.T, cfg Config, fs []datapath.Frontend) *xtables.Fake {
	t.Helper()
	k := xtables.NewFake()
	p := datapath.Plan{Frontends: slices.Clone(fs), Full: true}
	p.Sort()
	if _, err := newFakeFamily(cfg, k).apply(context.Background(), &p, modeRewrite); err != nil {
		t.Fatal(err)
	}
	return k
}

// outcome is the paths of a trace in flow.want's form.
func outcome(paths []xtables.Path) string {
	var out []string
	for _, p := range paths {
		var s string
		switch {
		case p.Verdict != xtables.Accepted:
			s = string(p.Verdict)
		case p.To.IsValid():
			s = p.To.String()
		default:
			s = "ACCEPT"
			if p.Local {
				s += " local"
			}
		}
		if p.Masquerade && p.Verdict == xtables.Accepted {
			s += " masq"
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return strings.Join(slices.Compact(out), ", ")
}

func trace(t *testing.T, k *xtables.Fake, fl flow, local []netip.Addr) []xtables.Path {
	t.Helper()
	proto := fl.proto
	if proto == "" {
		proto = "tcp"
	}
	paths, err := k.Trace(xtables.Packet{Src: netip.MustParseAddr(fl.src), Dst: netip.MustParseAddr(fl.dst), Proto: proto, Port: fl.port, InIface: fl.iface}, local)
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, p := range paths {
		sum += p.Probability
	}
	if math.Abs(sum-1) > 1e-9 {
		t.Errorf("the paths' probabilities sum to %v, want 1", sum)
	}
	return paths
}

func runFlows(t *testing.T, k *xtables.Fake, local []netip.Addr, flows []flow) {
	t.Helper()
	for _, fl := range flows {
		t.Run(fl.name, func(t *testing.T) {
			paths := trace(t, k, fl, local)
			if got := outcome(paths); got != fl.want {
				var chains []string
				for _, p := range paths {
					chains = append(chains, strings.Join(p.Chains, " > "))
				}
				t.Errorf("%s %s -> %s:%d = %q, want %q\npaths:\n  %s", fl.proto, fl.src, fl.dst, fl.port, got, fl.want, strings.Join(chains, "\n  "))
			}
		})
	}
}

func TestPacketFlows(t *testing.T) {
	cfg := Config{Family: datapath.IPv4, MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{podCIDR4}, HealthCheckPorts: []uint16{31000}}
	k := syncedFake(t, cfg, samplePlan())
	node := nodeIP4.String()
	runFlows(t, k, []netip.Addr{nodeIP4}, []flow{
		// ClusterIP.
		{name: "cluster IP from a pod", src: localPod4, dst: "10.96.0.10", port: 80, want: "10.244.0.2:8080, 10.244.0.3:8080"},
		{name: "cluster IP from off the cluster is masqueraded", src: outside4, dst: "10.96.0.10", port: 80, want: "10.244.0.2:8080 masq, 10.244.0.3:8080 masq"},
		{name: "cluster IP from the node is masqueraded", src: node, dst: "10.96.0.10", port: 80, want: "10.244.0.2:8080 masq, 10.244.0.3:8080 masq"},
		{name: "cluster IP, another port", src: localPod4, dst: "10.96.0.10", port: 81, want: "ACCEPT"},
		{name: "cluster IP, another protocol", src: localPod4, dst: "10.96.0.10", proto: "udp", port: 80, want: "ACCEPT"},
		{name: "cluster IP UDP", src: localPod4, dst: "10.96.0.53", proto: "udp", port: 53, want: "10.244.0.4:5353, 10.244.0.5:5353, 10.244.0.6:5353"},
		{name: "cluster IP TCP on the same address", src: localPod4, dst: "10.96.0.53", port: 53, want: "10.244.0.4:5353"},
		{name: "cluster IP SCTP", src: localPod4, dst: "10.96.1.2", proto: "sctp", port: 9000, want: "10.244.1.3:9000"},
		{name: "cluster IP without endpoints is refused", src: localPod4, dst: "10.96.0.30", port: 80, want: "REJECT"},
		{name: "cluster IP without endpoints, from the node", src: node, dst: "10.96.0.30", port: 80, want: "REJECT"},
		{name: "internal policy Local without local endpoints is dropped", src: localPod4, dst: "10.96.1.3", port: 80, want: "DROP"},
		{name: "internal policy Local keeps the local endpoints", src: localPod4, dst: "10.96.1.5", port: 80, want: "10.244.0.7:80"},
		// Hairpin: an endpoint reaching itself through its service.
		{name: "hairpin is masqueraded, only to itself", src: "10.244.0.2", dst: "10.96.0.10", port: 80, want: "10.244.0.2:8080 masq, 10.244.0.3:8080"},
		{name: "a remote endpoint reaching itself is not this node's hairpin", src: "10.244.1.2", dst: "10.96.1.1", port: 443, want: "10.244.0.2:8443, 10.244.1.2:8443"},
		// NodePort.
		{name: "node port on a node address", src: outside4, dst: node, port: 30080, want: "10.244.0.2:8080 masq, 10.244.0.3:8080 masq"},
		{name: "node port from a pod", src: localPod4, dst: node, port: 30080, want: "10.244.0.2:8080 masq, 10.244.0.3:8080 masq"},
		{name: "node port from the node", src: node, dst: node, port: 30080, want: "10.244.0.2:8080 masq, 10.244.0.3:8080 masq"},
		{name: "node port on another address is not ours", src: outside4, dst: "192.168.1.99", port: 30080, want: "ACCEPT"},
		{name: "node port on localhost without localhostNodePorts", src: node, dst: "127.0.0.1", port: 30080, want: "ACCEPT local"},
		{name: "node port without endpoints is refused", src: outside4, dst: node, port: 30030, want: "REJECT"},
		{name: "unused node port reaches the node", src: outside4, dst: node, port: 30999, want: "ACCEPT local"},
		{name: "health check node port is accepted", src: outside4, dst: node, port: 31000, want: "ACCEPT local"},
		// externalTrafficPolicy Local.
		{name: "eTP Local node port: local endpoints, source kept", src: outside4, dst: node, port: 30443, want: "10.244.0.2:8443"},
		{name: "eTP Local from a pod short-circuits to the cluster", src: localPod4, dst: node, port: 30443, want: "10.244.0.2:8443, 10.244.1.2:8443"},
		{name: "eTP Local from the node short-circuits, masqueraded", src: node, dst: node, port: 30443, want: "10.244.0.2:8443 masq, 10.244.1.2:8443 masq"},
		{name: "eTP Local without a local endpoint drops outside traffic", src: outside4, dst: node, proto: "sctp", port: 30900, want: "DROP"},
		{name: "eTP Local without a local endpoint, pods still reach the cluster", src: localPod4, dst: node, proto: "sctp", port: 30900, want: "10.244.1.3:9000"},
		{name: "eTP Local both policies: node port short-circuit", src: localPod4, dst: node, port: 30005, want: "10.244.0.7:80, 10.244.1.7:80"},
		{name: "eTP Local both policies: outside gets the local one", src: outside4, dst: node, port: 30005, want: "10.244.0.7:80"},
		// LoadBalancer and its source ranges.
		{name: "load balancer from an allowed source", src: "192.168.77.5", dst: "172.30.0.100", port: 443, want: "10.244.0.2:8443"},
		{name: "load balancer from a source outside the ranges", src: outside4, dst: "172.30.0.100", port: 443, want: "DROP"},
		{name: "load balancer from a pod outside the ranges is dropped too, as kube-proxy does", src: localPod4, dst: "172.30.0.100", port: 443, want: "DROP"},
		{name: "load balancer without endpoints is refused", src: outside4, dst: "172.30.0.104", port: 80, want: "REJECT"},
		{name: "the node's own traffic to an external address without endpoints goes on", src: node, dst: "172.30.0.104", port: 80, want: "ACCEPT"},
		// externalIPs.
		{name: "external IP from outside is masqueraded", src: outside4, dst: "172.30.0.5", port: 80, want: "10.244.0.2:8080 masq, 10.244.0.3:8080 masq"},
		{name: "external IP from a pod is masqueraded too", src: localPod4, dst: "172.30.0.5", port: 80, want: "10.244.0.2:8080 masq, 10.244.0.3:8080 masq"},
		{name: "external IP, another port", src: outside4, dst: "172.30.0.5", port: 443, want: "ACCEPT"},
		// The other family's frontends are not in an IPv4 ruleset.
		{name: "an address no rule names", src: outside4, dst: "10.96.9.9", port: 80, want: "ACCEPT"},
	})
}

// TestPacketFlowsDetectLocal: kube-proxy's local-traffic detection
// modes. What tells a pod decides whether its traffic to a ClusterIP is
// masqueraded and whether it may use a Local external frontend's
// cluster-wide endpoints: its source in the cluster range (ClusterCIDR),
// in this node's pod range (NodeCIDR, from the plan's PodCIDRs), the
// bridge it arrives on (BridgeInterface) or an interface name prefix
// (InterfaceNamePrefix); with nothing to tell pods, ClusterIP traffic is
// not masqueraded and no one short-circuits.
func TestPacketFlowsDetectLocal(t *testing.T) {
	const (
		pod       = "10.244.0.9" // a pod on this node
		remotePod = "10.244.1.5" // a pod on another node, routed in
		strayPod  = "172.16.0.9" // a pod whose address is outside every pod range
		vip       = "10.96.0.10" // two endpoints
	)
	cluster := "10.244.0.2:8080, 10.244.0.3:8080"
	masq := "10.244.0.2:8080 masq, 10.244.0.3:8080 masq"
	node := nodeIP4.String()
	podCIDRs := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24"), netip.MustParsePrefix("fd00:244::/64")}
	for _, c := range []struct {
		mode  string
		cfg   Config
		node  bool // the pod range comes from the plan (NodeCIDR)
		flows []flow
	}{
		{"ClusterCIDR", Config{ClusterCIDRs: []netip.Prefix{podCIDR4}}, false, []flow{
			{name: "pod", src: pod, iface: "veth1", dst: vip, port: 80, want: cluster},
			{name: "another node's pod", src: remotePod, iface: "eth0", dst: vip, port: 80, want: cluster},
			{name: "outside", src: outside4, iface: "eth0", dst: vip, port: 80, want: masq},
			{name: "eTP Local, pod short-circuits", src: pod, iface: "veth1", dst: node, proto: "sctp", port: 30900, want: "10.244.1.3:9000"},
			{name: "eTP Local, outside dropped", src: outside4, iface: "eth0", dst: node, proto: "sctp", port: 30900, want: "DROP"},
		}},
		{"NodeCIDR", Config{}, true, []flow{
			{name: "pod", src: pod, iface: "veth1", dst: vip, port: 80, want: cluster},
			{name: "another node's pod is masqueraded", src: remotePod, iface: "eth0", dst: vip, port: 80, want: masq},
			{name: "outside", src: outside4, iface: "eth0", dst: vip, port: 80, want: masq},
			{name: "eTP Local, pod short-circuits", src: pod, iface: "veth1", dst: node, proto: "sctp", port: 30900, want: "10.244.1.3:9000"},
			{name: "eTP Local, another node's pod dropped", src: remotePod, iface: "eth0", dst: node, proto: "sctp", port: 30900, want: "DROP"},
		}},
		{"BridgeInterface", Config{ClusterCIDRs: []netip.Prefix{podCIDR4}, PodInterface: "cni0"}, false, []flow{
			{name: "pod on the bridge", src: pod, iface: "cni0", dst: vip, port: 80, want: cluster},
			{name: "pod address outside the ranges, on the bridge", src: strayPod, iface: "cni0", dst: vip, port: 80, want: cluster},
			{name: "pod address arriving elsewhere is masqueraded", src: pod, iface: "eth0", dst: vip, port: 80, want: masq},
			{name: "another bridge by a longer name", src: pod, iface: "cni01", dst: vip, port: 80, want: masq},
			{name: "outside", src: outside4, iface: "eth0", dst: vip, port: 80, want: masq},
			{name: "the node itself is masqueraded", src: node, dst: vip, port: 80, want: masq},
			{name: "eTP Local, pod short-circuits", src: strayPod, iface: "cni0", dst: node, proto: "sctp", port: 30900, want: "10.244.1.3:9000"},
			{name: "eTP Local, outside dropped", src: pod, iface: "eth0", dst: node, proto: "sctp", port: 30900, want: "DROP"},
		}},
		{"InterfaceNamePrefix", Config{ClusterCIDRs: []netip.Prefix{podCIDR4}, PodInterface: "veth+"}, false, []flow{
			{name: "pod on a veth", src: pod, iface: "veth1a2b3c", dst: vip, port: 80, want: cluster},
			{name: "pod address outside the ranges, on a veth", src: strayPod, iface: "veth9", dst: vip, port: 80, want: cluster},
			{name: "pod address on the bridge is masqueraded", src: pod, iface: "cni0", dst: vip, port: 80, want: masq},
			{name: "a shorter name than the prefix", src: pod, iface: "vet", dst: vip, port: 80, want: masq},
			{name: "outside", src: outside4, iface: "eth0", dst: vip, port: 80, want: masq},
			{name: "eTP Local, pod short-circuits", src: pod, iface: "veth9", dst: node, proto: "sctp", port: 30900, want: "10.244.1.3:9000"},
			{name: "eTP Local, outside dropped", src: outside4, iface: "eth0", dst: node, proto: "sctp", port: 30900, want: "DROP"},
		}},
		{"nothing tells pods", Config{}, false, []flow{
			{name: "pod is not masqueraded", src: pod, iface: "veth1", dst: vip, port: 80, want: cluster},
			{name: "outside is not masqueraded either", src: outside4, iface: "eth0", dst: vip, port: 80, want: cluster},
			{name: "nor the node (its own address answers)", src: node, dst: vip, port: 80, want: cluster},
			{name: "eTP Local, no short-circuit for pods", src: pod, iface: "veth1", dst: node, proto: "sctp", port: 30900, want: "DROP"},
		}},
	} {
		t.Run(c.mode, func(t *testing.T) {
			cfg := c.cfg
			cfg.Family, cfg.MasqueradeBit = datapath.IPv4, 14
			k := xtables.NewFake()
			f := newFakeFamily(cfg, k)
			plan := datapath.Plan{Frontends: samplePlan(), Full: true}
			if c.node {
				plan.PodCIDRs = podCIDRs
				f.followPodCIDRs(plan.PodCIDRs)
			}
			if _, err := f.apply(context.Background(), &plan, modeRewrite); err != nil {
				t.Fatal(err)
			}
			runFlows(t, k, []netip.Addr{nodeIP4}, c.flows)
		})
	}
}

// TestPacketFlowsDetectLocalIPv6: the modes in an IPv6 ruleset. The
// interface modes are the same for both families; NodeCIDR takes the
// Node's IPv6 range.
func TestPacketFlowsDetectLocalIPv6(t *testing.T) {
	svc := datapath.ServicePortName{Namespace: "default", Name: "v6", Port: "http"}
	fs := []datapath.Frontend{{Service: svc, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: netip.MustParseAddr("fd00::10"), Family: datapath.IPv6, Port: 80,
		Endpoints: []datapath.Endpoint{ep("[fd00:244::2]:8080", 1, true)}}}
	const pod, remotePod, vip = "fd00:244::9", "fd00:244:0:1::5", "fd00::10"
	local, masq := "[fd00:244::2]:8080", "[fd00:244::2]:8080 masq"
	for _, c := range []struct {
		mode  string
		cfg   Config
		flows []flow
	}{
		{"NodeCIDR", Config{}, []flow{
			{name: "pod", src: pod, iface: "veth1", dst: vip, port: 80, want: local},
			{name: "another node's pod", src: remotePod, iface: "eth0", dst: vip, port: 80, want: masq},
			{name: "outside", src: outside6, iface: "eth0", dst: vip, port: 80, want: masq},
		}},
		{"BridgeInterface", Config{PodInterface: "cni0"}, []flow{
			{name: "pod on the bridge", src: pod, iface: "cni0", dst: vip, port: 80, want: local},
			{name: "pod address arriving elsewhere", src: pod, iface: "eth0", dst: vip, port: 80, want: masq},
		}},
		{"InterfaceNamePrefix", Config{PodInterface: "veth+"}, []flow{
			{name: "pod on a veth", src: remotePod, iface: "veth7", dst: vip, port: 80, want: local},
			{name: "outside", src: outside6, iface: "eth0", dst: vip, port: 80, want: masq},
		}},
	} {
		t.Run(c.mode, func(t *testing.T) {
			cfg := c.cfg
			cfg.Family, cfg.MasqueradeBit = datapath.IPv6, 14
			k := xtables.NewFake()
			f := newFakeFamily(cfg, k)
			plan := datapath.Plan{Frontends: fs, Full: true}
			if c.mode == "NodeCIDR" {
				plan.PodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24"), netip.MustParsePrefix("fd00:244::/64")}
				f.followPodCIDRs(plan.PodCIDRs)
			}
			if _, err := f.apply(context.Background(), &plan, modeRewrite); err != nil {
				t.Fatal(err)
			}
			runFlows(t, k, []netip.Addr{nodeIP6}, c.flows)
		})
	}
}

// TestNodeCIDRFollowsTheNode: the Node's pod range arriving (or
// changing) after the first sync is taken by the next partial sync of an
// unrelated change: every unit is rendered again.
func TestNodeCIDRFollowsTheNode(t *testing.T) {
	k := xtables.NewFake()
	f := newFakeFamily(Config{Family: datapath.IPv4, MasqueradeBit: 14}, k)
	ctx := context.Background()
	plan := datapath.Plan{Frontends: samplePlan(), Full: true}
	f.followPodCIDRs(nil) // the Node has no podCIDRs yet
	if _, err := f.apply(ctx, &plan, modeRewrite); err != nil {
		t.Fatal(err)
	}
	outsideFlow := flow{name: "outside", src: outside4, iface: "eth0", dst: "10.96.0.10", port: 80}
	if got := outcome(trace(t, k, outsideFlow, []netip.Addr{nodeIP4})); got != "10.244.0.2:8080, 10.244.0.3:8080" {
		t.Fatalf("before the Node's range: %s, want no masquerade (nothing tells pods)", got)
	}
	next := datapath.Plan{Frontends: samplePlan(), Changed: map[datapath.ServicePortName]bool{}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24")}}
	f.followPodCIDRs(next.PodCIDRs)
	if _, err := f.apply(ctx, &next, modePartial); err != nil {
		t.Fatal(err)
	}
	runFlows(t, k, []netip.Addr{nodeIP4}, []flow{
		{name: "outside is masqueraded now", src: outside4, iface: "eth0", dst: "10.96.0.10", port: 80, want: "10.244.0.2:8080 masq, 10.244.0.3:8080 masq"},
		{name: "pod", src: "10.244.0.9", iface: "veth1", dst: "10.96.0.10", port: 80, want: "10.244.0.2:8080, 10.244.0.3:8080"},
		{name: "eTP Local, pod short-circuits now", src: "10.244.0.9", iface: "veth1", dst: nodeIP4.String(), proto: "sctp", port: 30900, want: "10.244.1.3:9000"},
	})
}

// TestPacketFlowsMartians: with localhost node ports, 127.0.0.1 answers a
// node port for the node itself, and martians to 127.0.0.0/8 from the
// network are dropped unless DNATed.
func TestPacketFlowsLocalhost(t *testing.T) {
	cfg := Config{Family: datapath.IPv4, MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{podCIDR4}, LocalhostNodePorts: true}
	k := syncedFake(t, cfg, samplePlan())
	runFlows(t, k, []netip.Addr{nodeIP4}, []flow{
		{name: "node port on localhost", src: "127.0.0.1", dst: "127.0.0.1", port: 30080, want: "10.244.0.2:8080 masq, 10.244.0.3:8080 masq"},
		{name: "localnet martian from the network is dropped", src: outside4, dst: "127.0.0.1", port: 22, want: "DROP"},
		// Dropped before the no-endpoints reject: a neighbour learns
		// nothing of the node's loopback (kube-proxy's KUBE-FIREWALL
		// comes first in INPUT; the conformance matrix's
		// np-no-endpoints/np-lo/ext cells showed the refusal).
		{name: "no-endpoints node port on 127.0.0.1 from the network is dropped, not refused", src: outside4, dst: "127.0.0.1", port: 30030, want: "DROP"},
		{name: "the node's own loopback traffic passes", src: "127.0.0.1", dst: "127.0.0.1", port: 22, want: "ACCEPT local"},
	})
}

// TestPacketFlowsMasqueradeAll: every packet to a ClusterIP is
// masqueraded, from pods too.
func TestPacketFlowsMasqueradeAll(t *testing.T) {
	cfg := Config{Family: datapath.IPv4, MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{podCIDR4}, MasqueradeAll: true}
	k := syncedFake(t, cfg, samplePlan())
	runFlows(t, k, []netip.Addr{nodeIP4}, []flow{
		{name: "cluster IP from a pod", src: localPod4, dst: "10.96.0.10", port: 80, want: "10.244.0.2:8080 masq, 10.244.0.3:8080 masq"},
	})
}

// TestPacketFlowsNodePortAddresses: nodePortAddresses limits node ports
// to the listed addresses of the node.
func TestPacketFlowsNodePortAddresses(t *testing.T) {
	other := netip.MustParseAddr("192.168.2.10")
	cfg := Config{Family: datapath.IPv4, MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{podCIDR4}, NodePortIPs: []netip.Addr{nodeIP4}}
	k := syncedFake(t, cfg, samplePlan())
	runFlows(t, k, []netip.Addr{nodeIP4, other}, []flow{
		{name: "listed address", src: outside4, dst: nodeIP4.String(), port: 30080, want: "10.244.0.2:8080 masq, 10.244.0.3:8080 masq"},
		{name: "another node address", src: outside4, dst: other.String(), port: 30080, want: "ACCEPT local"},
		{name: "no endpoints: refused on any node address", src: outside4, dst: other.String(), port: 30030, want: "REJECT"},
	})
}

func TestPacketFlowsIPv6(t *testing.T) {
	cfg := Config{Family: datapath.IPv6, MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{podCIDR4, podCIDR6}}
	a := netip.MustParseAddr
	svc := datapath.ServicePortName{Namespace: "default", Name: "v6", Port: "http"}
	eps := []datapath.Endpoint{ep("[fd00:244::2]:8080", 1, true), ep("[fd00:244:0:1::2]:8080", 1, false)}
	fs := []datapath.Frontend{
		{Service: svc, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: a("fd00::10"), Family: datapath.IPv6, Port: 80, Endpoints: eps},
		{Service: svc, Kind: datapath.NodePort, Protocol: datapath.TCP, Family: datapath.IPv6, Port: 30080, Endpoints: eps},
		{Service: datapath.ServicePortName{Namespace: "default", Name: "empty6"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: a("fd00::30"), Family: datapath.IPv6, Port: 80},
		// An IPv4 frontend: not in the IPv6 ruleset.
		{Service: datapath.ServicePortName{Namespace: "default", Name: "v4"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: a("10.96.0.10"), Family: datapath.IPv4, Port: 80,
			Endpoints: []datapath.Endpoint{ep("10.244.0.2:8080", 1, true)}},
	}
	k := syncedFake(t, cfg, fs)
	runFlows(t, k, []netip.Addr{nodeIP6}, []flow{
		{name: "cluster IP from a pod", src: "fd00:244::9", dst: "fd00::10", port: 80, want: "[fd00:244:0:1::2]:8080, [fd00:244::2]:8080"},
		{name: "cluster IP from off the cluster", src: outside6, dst: "fd00::10", port: 80, want: "[fd00:244:0:1::2]:8080 masq, [fd00:244::2]:8080 masq"},
		{name: "hairpin", src: "fd00:244::2", dst: "fd00::10", port: 80, want: "[fd00:244:0:1::2]:8080, [fd00:244::2]:8080 masq"},
		{name: "node port", src: outside6, dst: nodeIP6.String(), port: 30080, want: "[fd00:244:0:1::2]:8080 masq, [fd00:244::2]:8080 masq"},
		{name: "no node port on ::1", src: "::1", dst: "::1", port: 30080, want: "ACCEPT local"},
		{name: "no endpoints", src: "fd00:244::9", dst: "fd00::30", port: 80, want: "REJECT"},
	})
}

// TestPacketFlowProbabilities: the statistic cascade gives endpoint i
// exactly w_i / Σw, for the weights a plan may carry.
func TestPacketFlowProbabilities(t *testing.T) {
	cfg := Config{Family: datapath.IPv4, MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{podCIDR4}}
	for _, weights := range [][]uint32{{1}, {1, 1}, {3, 1}, {1, 2, 3, 4, 5}, {1, 1, 1, 1, 1, 1, 1}, {1000, 1, 1}, {1, 10000}} {
		t.Run(fmt.Sprint(weights), func(t *testing.T) {
			var eps []datapath.Endpoint
			var total float64
			for i, w := range weights {
				eps = append(eps, ep(fmt.Sprintf("10.244.0.%d:80", i+1), w, false))
				total += float64(w)
			}
			f := datapath.Frontend{Service: SPN("ns/w:p"), Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: netip.MustParseAddr("10.96.0.1"), Family: datapath.IPv4, Port: 80, Endpoints: eps}
			k := syncedFake(t, cfg, []datapath.Frontend{f})
			paths := trace(t, k, flow{src: localPod4, dst: "10.96.0.1", port: 80}, []netip.Addr{nodeIP4})
			got := map[netip.AddrPort]float64{}
			for _, p := range paths {
				got[p.To] += p.Probability
			}
			for i, e := range eps {
				// The rendered probabilities have 10 decimals.
				if want := float64(weights[i]) / total; math.Abs(got[e.Addr]-want) > 1e-9*float64(len(eps)) {
					t.Errorf("endpoint %s: probability %v, want %v", e.Addr, got[e.Addr], want)
				}
			}
			if len(got) != len(eps) {
				t.Errorf("%d destinations, want %d: %v", len(got), len(eps), got)
			}
		})
	}
}

// TestPacketFlowAffinity: with ClientIP affinity a new client still
// reaches every endpoint, through the endpoint chains that record it
// (recent --set) before the DNAT.
func TestPacketFlowAffinity(t *testing.T) {
	cfg := Config{Family: datapath.IPv4, MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{podCIDR4}}
	fs := samplePlan()
	k := syncedFake(t, cfg, fs)
	paths := trace(t, k, flow{src: localPod4, dst: "10.96.0.20", port: 8080}, []netip.Addr{nodeIP4})
	if got, want := outcome(paths), "10.244.0.2:8080, 10.244.0.3:8080"; got != want {
		t.Fatalf("sticky service: %q, want %q", got, want)
	}
	for _, p := range paths {
		sep := slices.IndexFunc(p.Chains, func(c string) bool { return strings.HasPrefix(c, "nat/"+Prefix+kindSep+"-") })
		if sep < 0 {
			t.Fatalf("path to %s did not pass an endpoint chain: %v", p.To, p.Chains)
		}
		rules, _ := k.Rules(xtables.Chain{Table: xtables.NAT, Name: strings.TrimPrefix(p.Chains[sep], "nat/")})
		if len(rules) != 1 || !strings.Contains(rules[0].Text(), "--set") {
			t.Errorf("endpoint chain %s: %v, want one rule recording the client", p.Chains[sep], rules)
		}
	}
	// The service chain checks the recorded clients first: one rule per
	// endpoint, for the affinity's seconds (3 h).
	var svc []xtables.Rule
	for _, c := range paths[0].Chains {
		if strings.HasPrefix(c, "nat/"+Prefix+kindSvc+"-") {
			svc, _ = k.Rules(xtables.Chain{Table: xtables.NAT, Name: strings.TrimPrefix(c, "nat/")})
		}
	}
	secs := fmt.Sprintf("--rcheck --seconds %d", int((3 * time.Hour).Seconds()))
	if len(svc) < 2 || !strings.Contains(svc[0].Text(), secs) || !strings.Contains(svc[1].Text(), secs) {
		t.Errorf("service chain %v: want a recent check (%s) per endpoint first", svc, secs)
	}
}

// TestPacketFlowsSourceRangesHoldNode: when a load balancer's source
// ranges hold the node's address (the planner sets SourceRangesHoldNode),
// a packet whose source is the load balancer's own address gets through,
// as kube-proxy lets a VIP-like balancer loop the node's requests back;
// otherwise that source is outside the ranges like any other.
func TestPacketFlowsSourceRangesHoldNode(t *testing.T) {
	cfg := Config{Family: datapath.IPv4, MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{podCIDR4}}
	lb := func(name, addr, ranges string, holdsNode bool) datapath.Frontend {
		return datapath.Frontend{Service: datapath.ServicePortName{Namespace: "edge", Name: name}, Kind: datapath.LoadBalancer, Protocol: datapath.TCP,
			Addr: netip.MustParseAddr(addr), Family: datapath.IPv4, Port: 443, SourceRanges: []netip.Prefix{netip.MustParsePrefix(ranges)},
			SourceRangesHoldNode: holdsNode, Endpoints: []datapath.Endpoint{ep("10.244.0.2:8443", 1, true)}}
	}
	k := syncedFake(t, cfg, []datapath.Frontend{
		lb("holds-node", "172.30.0.110", "192.168.1.0/24", true),
		lb("elsewhere", "172.30.0.111", "198.51.100.0/24", false),
	})
	runFlows(t, k, []netip.Addr{nodeIP4}, []flow{
		{name: "from the balancer's own address, ranges hold the node", src: "172.30.0.110", dst: "172.30.0.110", port: 443, want: "10.244.0.2:8443 masq"},
		{name: "from the node, inside the ranges", src: nodeIP4.String(), dst: "172.30.0.110", port: 443, want: "10.244.0.2:8443 masq"},
		{name: "from outside the ranges", src: outside4, dst: "172.30.0.110", port: 443, want: "DROP"},
		{name: "from the balancer's own address, ranges elsewhere", src: "172.30.0.111", dst: "172.30.0.111", port: 443, want: "DROP"},
		{name: "from an allowed source, ranges elsewhere", src: "198.51.100.7", dst: "172.30.0.111", port: 443, want: "10.244.0.2:8443 masq"},
	})
}
