package iptables_test

import (
	"errors"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/iptables"
	"github.com/edgeproxy/edgeproxy/datapath/xtables"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// TestTraceAgreesWithKernel: the packet-flow tests trust xtables' tracer,
// which is only right if it agrees with the kernel. One plan is applied
// by a real Proxier in a node namespace and, with the same rendering
// configuration, to an xtables.Fake; for each flow the outcome the
// tracer predicts (the endpoints it may land on, masqueraded or not, or
// REJECT or DROP) must be what real TCP connections get.
func TestTraceAgreesWithKernel(t *testing.T) {
	eachVariant(t, func(t *testing.T, v iptables.Variant) {
		e := newEnv(t, v, 3, nil)
		a, b, c := e.pods[0], e.pods[1], e.pods[2]
		lb := fe("default/lb:https", datapath.LoadBalancer, datapath.TCP, lbIP, 443, e.ep(0, 1))
		lb.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.168.77.0/24")}
		denied := fe("default/lb2:https", datapath.LoadBalancer, datapath.TCP, lbIPDenied, 443, e.ep(0, 1))
		denied.SourceRanges = []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}
		local := fe("default/local:http", datapath.NodePort, datapath.TCP, netip.Addr{}, 30443, e.ep(0, 1))
		local.LocalOnly, local.Cluster = true, []datapath.Endpoint{e.ep(0, 1), e.ep(1, 1)}
		none := fe("default/none:http", datapath.NodePort, datapath.TCP, netip.Addr{}, 30900)
		none.LocalOnly, none.Drop, none.Cluster = true, true, []datapath.Endpoint{e.ep(2, 1)}
		plan := &datapath.Plan{Full: true, Frontends: []datapath.Frontend{
			fe("default/web:http", datapath.ClusterIP, datapath.TCP, vip, 80, e.ep(0, 1), e.ep(1, 1)),
			fe("default/web:http", datapath.NodePort, datapath.TCP, netip.Addr{}, 30080, e.ep(0, 1), e.ep(1, 1)),
			fe("default/web:http", datapath.ExternalIP, datapath.TCP, extIP, 80, e.ep(0, 1), e.ep(1, 1)),
			fe("default/empty:http", datapath.ClusterIP, datapath.TCP, vip2, 80),
			fe("default/local:http", datapath.ClusterIP, datapath.TCP, netip.MustParseAddr("10.96.0.12"), 80, e.ep(0, 1), e.ep(1, 1)),
			lb, denied, local, none,
		}}
		e.mustApply(plan)
		k := iptables.FakeOf(t, e.p, datapath.IPv4, plan)
		nodeAddrs := []netip.Addr{e.node.LinkIP, e.node.Gateway}
		names := map[string]netip.AddrPort{}
		for _, p := range e.pods {
			names[p.PodName] = p.AddrPort(podPort)
		}
		type from struct {
			ns  *netns.NS
			src netip.Addr
		}
		client, node := from{e.client, netip.MustParseAddr("192.168.77.2")}, from{e.node.NS, e.node.LinkIP}
		podA, podC := from{a.NS, a.IP}, from{c.NS, c.IP}
		for _, fl := range []struct {
			name string
			from from
			dst  netip.AddrPort
		}{
			{"pod -> cluster IP", podC, ap(vip, 80)},
			{"client -> cluster IP", client, ap(vip, 80)},
			{"node -> cluster IP", node, ap(vip, 80)},
			{"hairpin", podA, ap(vip, 80)},
			{"pod -> cluster IP without endpoints", podC, ap(vip2, 80)},
			{"node -> cluster IP without endpoints", node, ap(vip2, 80)},
			{"client -> node port", client, ap(e.node.LinkIP, 30080)},
			{"pod -> node port on the bridge address", podC, ap(e.node.Gateway, 30080)},
			{"node -> node port", node, ap(e.node.LinkIP, 30080)},
			{"client -> external IP", client, ap(extIP, 80)},
			{"client -> load balancer, allowed", client, ap(lbIP, 443)},
			{"client -> load balancer, denied", client, ap(lbIPDenied, 443)},
			{"pod -> load balancer outside its ranges", podC, ap(lbIP, 443)},
			{"client -> eTP Local node port", client, ap(e.node.LinkIP, 30443)},
			{"pod -> eTP Local node port: short-circuit", podC, ap(e.node.LinkIP, 30443)},
			{"client -> eTP Local node port without local endpoints", client, ap(e.node.LinkIP, 30900)},
			{"pod -> eTP Local node port without local endpoints", podC, ap(e.node.LinkIP, 30900)},
		} {
			paths, err := k.Trace(xtables.Packet{Src: fl.from.src, Dst: fl.dst.Addr(), Proto: "tcp", Port: fl.dst.Port()}, nodeAddrs)
			if err != nil {
				t.Fatalf("%s: %v", fl.name, err)
			}
			want := traced(paths)
			if got := connectAll(fl.from.ns, fl.from.src, fl.dst, names, want); !slices.Equal(got, want) {
				t.Errorf("%s: the kernel gives %q, the tracer %q", fl.name, got, want)
			}
		}
		_ = b
	})
}

// traced is the distinct outcomes of paths: "ADDR:PORT", with " masq"
// when masqueraded, or the verdict when not accepted.
func traced(paths []xtables.Path) []string {
	var out []string
	for _, p := range paths {
		s := string(p.Verdict)
		if p.Verdict == xtables.Accepted {
			s = p.To.String()
			if p.Masquerade {
				s += " masq"
			}
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// connectAll connects from ns to dst until it has seen every outcome of
// want, or one want lacks (at most 64 tries: 2^-63 odds of missing one
// of two even endpoints), and returns them in traced's form: the endpoint
// that answered (masqueraded when it saw another source than src),
// REJECT for a refused connection, DROP for one that timed out.
func connectAll(ns *netns.NS, src netip.Addr, dst netip.AddrPort, names map[string]netip.AddrPort, want []string) []string {
	wait := waitResp
	if slices.Contains(want, "DROP") {
		wait = waitDrop
	}
	seen := map[string]bool{}
	for range 64 {
		r, err := ns.TCP(dst, wait)
		var s string
		switch {
		case errors.Is(err, syscall.ECONNREFUSED):
			s = "REJECT"
		case errors.Is(err, os.ErrDeadlineExceeded) || err != nil && strings.Contains(err.Error(), "timeout"):
			s = "DROP"
		case err != nil:
			s = "error: " + err.Error()
		default:
			s = names[r.Name].String()
			if r.Client.Addr() != src {
				s += " masq"
			}
		}
		seen[s] = true
		if !slices.Contains(want, s) || allSeen(seen, want) {
			break // a difference, or everything predicted
		}
	}
	out := make([]string, 0, len(seen))
	for s := range seen {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

func allSeen(seen map[string]bool, want []string) bool {
	for _, w := range want {
		if !seen[w] {
			return false
		}
	}
	return true
}

// TestTraceDetectLocalAgreesWithKernel: the interface modes of local
// traffic detection (kube-proxy's BridgeInterface and
// InterfaceNamePrefix) as the kernel applies them. The pods' veths are
// ports of the node's bridge br0, so their routed packets come in on br0;
// the client's come in on its link. A prefix that names no interface a
// pod's packet arrives on ("veth+") tells no pod.
func TestTraceDetectLocalAgreesWithKernel(t *testing.T) {
	eachVariant(t, func(t *testing.T, v iptables.Variant) {
		for _, iface := range []string{"br0", "br+", "veth+"} {
			t.Run(iface, func(t *testing.T) { traceDetectLocal(t, v, iface) })
		}
	})
}

func traceDetectLocal(t *testing.T, v iptables.Variant, iface string) {
	e := newEnv(t, v, 3, func(o *iptables.Options) { o.PodInterface = iface })
	c := e.pods[2]
	none := fe("default/none:http", datapath.NodePort, datapath.TCP, netip.Addr{}, 30900)
	none.LocalOnly, none.Drop, none.Cluster = true, true, []datapath.Endpoint{e.ep(2, 1)}
	plan := &datapath.Plan{Full: true, Frontends: []datapath.Frontend{
		fe("default/web:http", datapath.ClusterIP, datapath.TCP, vip, 80, e.ep(0, 1), e.ep(1, 1)),
		none,
	}}
	e.mustApply(plan)
	k := iptables.FakeOf(t, e.p, datapath.IPv4, plan)
	nodeAddrs := []netip.Addr{e.node.LinkIP, e.node.Gateway}
	names := map[string]netip.AddrPort{}
	for _, p := range e.pods {
		names[p.PodName] = p.AddrPort(podPort)
	}
	client, clientLink := netip.MustParseAddr("192.168.77.2"), "c-client"
	for _, fl := range []struct {
		name string
		ns   *netns.NS
		src  netip.Addr
		in   string
		dst  netip.AddrPort
	}{
		{"pod -> cluster IP", c.NS, c.IP, e.node.Bridge, ap(vip, 80)},
		{"client -> cluster IP", e.client, client, clientLink, ap(vip, 80)},
		{"pod -> eTP Local node port without local endpoints", c.NS, c.IP, e.node.Bridge, ap(e.node.LinkIP, 30900)},
		{"client -> eTP Local node port without local endpoints", e.client, client, clientLink, ap(e.node.LinkIP, 30900)},
	} {
		paths, err := k.Trace(xtables.Packet{Src: fl.src, Dst: fl.dst.Addr(), Proto: "tcp", Port: fl.dst.Port(), InIface: fl.in}, nodeAddrs)
		if err != nil {
			t.Fatalf("%s: %v", fl.name, err)
		}
		want := traced(paths)
		if got := connectAll(fl.ns, fl.src, fl.dst, names, want); !slices.Equal(got, want) {
			t.Errorf("%s: the kernel gives %q, the tracer %q", fl.name, got, want)
		}
		t.Logf("%s: %q", fl.name, want)
	}
}
