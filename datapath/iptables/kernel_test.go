package iptables_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/conntrack"
	"github.com/edgeproxy/edgeproxy/datapath/iptables"
	"github.com/edgeproxy/edgeproxy/datapath/sysctl"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// Kernel tests: a node namespace with pods and an outside client, rules
// programmed by a real Proxier, real packets. Each runs once per iptables
// backend.

const (
	podPort  = 8080
	waitResp = 2 * time.Second
	waitDrop = 700 * time.Millisecond // how long to wait before calling a packet dropped
)

var (
	clusterCIDR = netip.MustParsePrefix("10.244.0.0/16")
	vip         = netip.MustParseAddr("10.96.0.10")
	vip2        = netip.MustParseAddr("10.96.0.11")
	extIP       = netip.MustParseAddr("172.30.0.5")
	lbIP        = netip.MustParseAddr("172.30.0.100")
	lbIPDenied  = netip.MustParseAddr("172.30.0.101")
)

type env struct {
	t       *testing.T
	variant iptables.Variant
	node    *netns.Node
	client  *netns.NS
	pods    []*netns.Pod
	p       *iptables.Proxier
}

func eachVariant(t *testing.T, fn func(t *testing.T, v iptables.Variant)) {
	gate.Root(t)
	for _, v := range []iptables.Variant{iptables.Legacy, iptables.NFT} {
		t.Run(string(v), func(t *testing.T) {
			gate.Binaries(t, "iptables-"+string(v), "iptables-"+string(v)+"-restore")
			fn(t, v)
		})
	}
}

// newEnv builds a node with n pods (a, b, c, ...) serving TCP and UDP on
// podPort, an outside client, and a Proxier in the node.
func newEnv(t *testing.T, v iptables.Variant, n int, mod func(*iptables.Options)) *env {
	e := &env{t: t, variant: v}
	e.node = netns.NewNode(t, "node")
	e.client = e.node.AddClient("client")
	for i := range n {
		p := e.node.AddPod(string(rune('a' + i)))
		if err := p.Serve(podPort); err != nil {
			t.Fatal(err)
		}
		e.pods = append(e.pods, p)
	}
	e.p = e.newProxier(mod)
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := e.node.Run("iptables-"+string(v)+"-save", "-c")
			t.Logf("iptables-save -c in the node:\n%s", out)
		}
	})
	return e
}

func (e *env) newProxier(mod func(*iptables.Options)) *iptables.Proxier {
	opts := iptables.Options{
		Variant: e.variant, MasqueradeBit: 14, LocalhostNodePorts: true,
		ClusterCIDRs: []netip.Prefix{clusterCIDR},
	}
	if mod != nil {
		mod(&opts)
	}
	var p *iptables.Proxier
	err := e.node.Do(func() error {
		var err error
		p, err = iptables.New(opts)
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

func (e *env) apply(p *iptables.Proxier, plan *datapath.Plan) error {
	plan.Sort()
	if err := plan.Validate(); err != nil {
		e.t.Fatal(err)
	}
	return e.node.Do(func() error { return p.Apply(context.Background(), plan) })
}

func (e *env) mustApply(plan *datapath.Plan) {
	e.t.Helper()
	if err := e.apply(e.p, plan); err != nil {
		e.t.Fatalf("apply: %v", err)
	}
}

func (e *env) iptables(args ...string) string {
	e.t.Helper()
	out, err := e.node.Run("iptables-"+string(e.variant), args...)
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

func (e *env) save() string {
	e.t.Helper()
	out, err := e.node.Run("iptables-" + string(e.variant) + "-save")
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

func (e *env) ep(i int, w uint32) datapath.Endpoint {
	return datapath.Endpoint{Addr: e.pods[i].AddrPort(podPort), Weight: w, Local: true}
}

func fe(svc string, kind datapath.Kind, proto datapath.Protocol, addr netip.Addr, port uint16, eps ...datapath.Endpoint) datapath.Frontend {
	return datapath.Frontend{Service: iptables.SPN(svc), Kind: kind, Protocol: proto, Addr: addr, Family: datapath.IPv4, Port: port, Endpoints: eps}
}

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

func expect(t *testing.T, what string, r netns.Reply, err error, name string, client netip.Addr) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if r.Name != name {
		t.Fatalf("%s: answered by %q, want %q", what, r.Name, name)
	}
	if client.IsValid() && r.Client.Addr() != client {
		t.Fatalf("%s: pod saw client %s, want %s", what, r.Client.Addr(), client)
	}
}

func TestFrontends(t *testing.T) {
	eachVariant(t, func(t *testing.T, v iptables.Variant) {
		e := newEnv(t, v, 3, nil)
		a, b, c := e.pods[0], e.pods[1], e.pods[2]
		lb := fe("default/lb:https", datapath.LoadBalancer, datapath.TCP, lbIP, 443, e.ep(0, 1))
		lb.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.168.77.0/24")}
		denied := fe("default/lb2:https", datapath.LoadBalancer, datapath.TCP, lbIPDenied, 443, e.ep(0, 1))
		denied.SourceRanges = []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}
		e.mustApply(&datapath.Plan{Full: true, Frontends: []datapath.Frontend{
			// Same port, both protocols, different endpoints.
			fe("default/web:tcp", datapath.ClusterIP, datapath.TCP, vip, 80, e.ep(0, 1)),
			fe("default/web:udp", datapath.ClusterIP, datapath.UDP, vip, 80, e.ep(1, 1)),
			fe("default/web:tcp", datapath.NodePort, datapath.TCP, netip.Addr{}, 30080, e.ep(0, 1)),
			fe("default/web:udp", datapath.NodePort, datapath.UDP, netip.Addr{}, 30080, e.ep(1, 1)),
			fe("default/web:tcp", datapath.ExternalIP, datapath.TCP, extIP, 80, e.ep(0, 1)),
			fe("default/lb:https", datapath.ClusterIP, datapath.TCP, vip2, 443, e.ep(0, 1)),
			lb, denied,
		}})

		r, err := c.TCP(ap(vip, 80), waitResp)
		expect(t, "pod c -> ClusterIP tcp", r, err, "a", c.IP) // source preserved
		r, err = c.UDP(ap(vip, 80), 0, waitResp)
		expect(t, "pod c -> ClusterIP udp", r, err, "b", c.IP)

		// NodePort: from the outside client, from the node, on localhost;
		// always masqueraded (the pod sees the node).
		r, err = e.client.TCP(ap(e.node.LinkIP, 30080), waitResp)
		expect(t, "client -> NodePort tcp", r, err, "a", e.node.Gateway)
		r, err = e.client.UDP(ap(e.node.LinkIP, 30080), 0, waitResp)
		expect(t, "client -> NodePort udp", r, err, "b", e.node.Gateway)
		r, err = e.node.TCP(ap(e.node.LinkIP, 30080), waitResp)
		expect(t, "node -> NodePort tcp", r, err, "a", e.node.Gateway)
		r, err = e.node.TCP(ap(netip.MustParseAddr("127.0.0.1"), 30080), waitResp)
		expect(t, "node -> localhost NodePort", r, err, "a", e.node.Gateway)
		r, err = c.TCP(ap(e.node.Gateway, 30080), waitResp)
		expect(t, "pod c -> NodePort on the bridge address", r, err, "a", e.node.Gateway)

		r, err = e.client.TCP(ap(extIP, 80), waitResp)
		expect(t, "client -> ExternalIP", r, err, "a", e.node.Gateway)
		r, err = e.client.TCP(ap(lbIP, 443), waitResp)
		expect(t, "client -> LoadBalancer (allowed source)", r, err, "a", e.node.Gateway)
		if r, err := e.client.TCP(ap(lbIPDenied, 443), waitDrop); err == nil {
			t.Fatalf("client -> LoadBalancer outside its source ranges answered by %s", r.Name)
		}
		if r, err := c.TCP(ap(lbIP, 443), waitDrop); err == nil {
			t.Fatalf("pod -> LoadBalancer outside its source ranges answered by %s", r.Name)
		}
		// Hairpin: a pod reaching itself through its service is masqueraded.
		r, err = a.TCP(ap(vip, 80), waitResp)
		expect(t, "pod a -> ClusterIP -> pod a", r, err, "a", e.node.Gateway)
		_ = b
	})
}

func TestNoEndpoints(t *testing.T) {
	eachVariant(t, func(t *testing.T, v iptables.Variant) {
		e := newEnv(t, v, 2, nil)
		// Local policies: endpoints exist elsewhere (Drop) for
		// default/local, nowhere for default/gone.
		local := fe("default/local:", datapath.NodePort, datapath.TCP, netip.Addr{}, 30099)
		local.LocalOnly, local.Drop = true, true
		localVIP := fe("default/local:", datapath.ClusterIP, datapath.TCP, vip2, 80)
		localVIP.Drop = true
		gone := fe("default/gone:", datapath.NodePort, datapath.TCP, netip.Addr{}, 30098)
		gone.LocalOnly = true
		// A jump an earlier version wrote: the first apply removes it.
		e.iptables("-N", "EP-EXTERNAL")
		e.iptables("-I", "OUTPUT", "-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "edgeproxy node ports", "-j", "EP-EXTERNAL")
		e.mustApply(&datapath.Plan{Full: true, Frontends: []datapath.Frontend{
			fe("default/empty:", datapath.ClusterIP, datapath.TCP, vip, 80),
			fe("default/empty:", datapath.NodePort, datapath.TCP, netip.Addr{}, 30080),
			fe("default/empty:", datapath.LoadBalancer, datapath.TCP, lbIP, 80),
			localVIP, local, gone,
		}})
		if out := e.iptables("-S", "OUTPUT"); strings.Contains(out, "edgeproxy node ports") {
			t.Fatalf("the obsolete OUTPUT jump is still there:\n%s", out)
		}
		refused := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Fatalf("%s: got %v, want connection refused", what, err)
			}
		}
		// Refused, not timed out: the dial timeout is long, the error is ECONNREFUSED.
		_, err := e.pods[0].TCP(ap(vip, 80), 10*time.Second)
		refused("pod -> ClusterIP without endpoints", err)
		_, err = e.node.TCP(ap(vip, 80), 10*time.Second)
		refused("node -> ClusterIP without endpoints", err)
		_, err = e.client.TCP(ap(e.node.LinkIP, 30080), 10*time.Second)
		refused("client -> NodePort without endpoints", err)
		// External addresses: refused when the traffic arrives or is
		// routed through; the node's own goes on its way, as with
		// kube-proxy (here to the client, which does not answer).
		_, err = e.client.TCP(ap(lbIP, 80), 10*time.Second)
		refused("client -> LoadBalancer IP without endpoints", err)
		_, err = e.pods[0].TCP(ap(lbIP, 80), 10*time.Second)
		refused("pod -> LoadBalancer IP without endpoints", err)
		if _, err = e.node.TCP(ap(lbIP, 80), waitDrop); errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("node -> LoadBalancer IP without endpoints refused by the node's own rules")
		}
		_, err = e.client.TCP(ap(e.node.LinkIP, 30098), 10*time.Second)
		refused("client -> Local NodePort without any endpoint", err)
		// Local policy with endpoints on other nodes only: dropped.
		dropped := func(what string, err error) {
			t.Helper()
			if err == nil || errors.Is(err, syscall.ECONNREFUSED) {
				t.Fatalf("%s: got %v, want a drop (timeout)", what, err)
			}
		}
		_, err = e.client.TCP(ap(e.node.LinkIP, 30099), waitDrop)
		dropped("client -> Local NodePort without local endpoints", err)
		_, err = e.pods[0].TCP(ap(vip2, 80), waitDrop)
		dropped("pod -> internal-Local ClusterIP without local endpoints", err)
	})
}

// TestWeights sends 2000 new connections to a service weighted 3:1 and
// checks the split. With p = 0.75 and n = 2000 the standard deviation of
// the share is 0.0097; the tolerance of 0.04 is over 4 of them.
func TestWeights(t *testing.T) {
	eachVariant(t, func(t *testing.T, v iptables.Variant) {
		e := newEnv(t, v, 3, nil)
		e.mustApply(&datapath.Plan{Full: true, Frontends: []datapath.Frontend{
			fe("default/w:", datapath.ClusterIP, datapath.TCP, vip, 80, e.ep(0, 3), e.ep(1, 1)),
		}})
		const n, tolerance = 2000, 0.04
		counts := map[string]int{}
		deadline := time.Now().Add(2 * time.Minute)
		err := e.pods[2].Do(func() error {
			for i := 0; i < n; i++ {
				if time.Now().After(deadline) {
					return fmt.Errorf("only %d of %d connections before the deadline", i, n)
				}
				c, err := net.DialTimeout("tcp", ap(vip, 80).String(), waitResp)
				if err != nil {
					return err
				}
				_ = c.SetDeadline(time.Now().Add(waitResp))
				buf := make([]byte, 64)
				k, err := c.Read(buf)
				c.Close()
				if err != nil {
					return err
				}
				counts[strings.Fields(string(buf[:k]))[0]]++
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		share := float64(counts["a"]) / n
		t.Logf("3:1 weights over %d connections: %v (share of a %.3f)", n, counts, share)
		if counts["a"]+counts["b"] != n || share < 0.75-tolerance || share > 0.75+tolerance {
			t.Fatalf("split %v: share of a %.3f, want 0.75 ± %.2f", counts, share, tolerance)
		}
	})
}

func TestAffinity(t *testing.T) {
	eachVariant(t, func(t *testing.T, v iptables.Variant) {
		e := newEnv(t, v, 3, nil)
		sticky := fe("default/sticky:", datapath.ClusterIP, datapath.TCP, vip, 80, e.ep(0, 1), e.ep(1, 1))
		sticky.Affinity = time.Hour
		e.mustApply(&datapath.Plan{Full: true, Frontends: []datapath.Frontend{
			sticky,
			fe("default/loose:", datapath.ClusterIP, datapath.TCP, vip2, 80, e.ep(0, 1), e.ep(1, 1)),
		}})
		// 40 connections each; without affinity all 40 land on one pod
		// with probability 2^-39, so the control cannot pass by chance.
		for _, tc := range []struct {
			addr   netip.Addr
			sticky bool
		}{{vip, true}, {vip2, false}} {
			seen := map[string]int{}
			for range 40 {
				r, err := e.pods[2].TCP(ap(tc.addr, 80), waitResp)
				if err != nil {
					t.Fatal(err)
				}
				seen[r.Name]++
			}
			if tc.sticky != (len(seen) == 1) {
				t.Fatalf("%s (affinity %v): endpoints seen %v", tc.addr, tc.sticky, seen)
			}
		}
	})
}

func TestLocalOnly(t *testing.T) {
	eachVariant(t, func(t *testing.T, v iptables.Variant) {
		e := newEnv(t, v, 2, nil)
		// Both traffic policies Local: the ClusterIP has only the local
		// endpoint a; b stands for an endpoint on another node. Pods and
		// the node reaching the external addresses use the cluster-wide
		// set (Cluster), outside clients the local one.
		np := fe("default/local:", datapath.NodePort, datapath.TCP, netip.Addr{}, 30080, e.ep(0, 1))
		np.LocalOnly, np.Cluster = true, []datapath.Endpoint{e.ep(0, 1), e.ep(1, 1)}
		lb := fe("default/local:", datapath.LoadBalancer, datapath.TCP, lbIP, 80, e.ep(0, 1))
		lb.LocalOnly, lb.Cluster = true, np.Cluster
		e.mustApply(&datapath.Plan{Full: true, Frontends: []datapath.Frontend{
			fe("default/local:", datapath.ClusterIP, datapath.TCP, vip, 80, e.ep(0, 1)),
			np, lb,
		}})
		clientIP := netip.MustParseAddr("192.168.77.2")
		for range 10 {
			r, err := e.client.TCP(ap(e.node.LinkIP, 30080), waitResp)
			expect(t, "client -> Local NodePort keeps its source", r, err, "a", clientIP)
			r, err = e.client.TCP(ap(lbIP, 80), waitResp)
			expect(t, "client -> Local LoadBalancer keeps its source", r, err, "a", clientIP)
		}
		// Pods reaching the external address use all endpoints (short-circuit).
		seen := map[string]bool{}
		for range 30 {
			r, err := e.pods[1].TCP(ap(lbIP, 80), waitResp)
			if err != nil {
				t.Fatal(err)
			}
			seen[r.Name] = true
		}
		if !seen["a"] || !seen["b"] {
			t.Fatalf("pod -> Local LoadBalancer reached %v, want both endpoints", seen)
		}
		// So does the node, masqueraded.
		seen = map[string]bool{}
		for range 30 {
			r, err := e.node.TCP(ap(e.node.LinkIP, 30080), waitResp)
			if err != nil {
				t.Fatal(err)
			}
			seen[r.Name] = true
		}
		if !seen["a"] || !seen["b"] {
			t.Fatalf("node -> Local NodePort reached %v, want both endpoints", seen)
		}
		// The ClusterIP keeps its local set.
		for range 10 {
			r, err := e.pods[1].TCP(ap(vip, 80), waitResp)
			expect(t, "pod -> internal-Local ClusterIP", r, err, "a", netip.Addr{})
		}
	})
}

// TestUDPStaleConntrack is the UDP blackhole case: a client sends from a
// fixed source port while its endpoint is replaced. Without conntrack
// cleanup it stays with the old pod (shown by the control run); with it,
// the reply comes from the new pod right after the next Apply.
func TestUDPStaleConntrack(t *testing.T) {
	eachVariant(t, func(t *testing.T, v iptables.Variant) {
		for _, cleanup := range []bool{true, false} {
			t.Run(fmt.Sprintf("cleanup=%v", cleanup), func(t *testing.T) {
				e := newEnv(t, v, 3, func(o *iptables.Options) { o.NoConntrack = !cleanup })
				client := e.pods[2]
				plan := func(ep datapath.Endpoint, serving ...datapath.Endpoint) *datapath.Plan {
					p := &datapath.Plan{Full: true, Frontends: []datapath.Frontend{
						fe("default/dns:", datapath.ClusterIP, datapath.UDP, vip, 53, ep),
						fe("default/dns:", datapath.NodePort, datapath.UDP, netip.Addr{}, 30053, ep),
					}}
					for i := range p.Frontends {
						for _, s := range append([]datapath.Endpoint{ep}, serving...) {
							p.Frontends[i].Serving = append(p.Frontends[i].Serving, s.Addr)
						}
					}
					return p
				}
				e.mustApply(plan(e.ep(0, 1)))
				r, err := client.UDP(ap(vip, 53), 45000, waitResp)
				expect(t, "before", r, err, "a", client.IP)
				r, err = e.client.UDP(ap(e.node.LinkIP, 30053), 45000, waitResp)
				expect(t, "NodePort before", r, err, "a", netip.Addr{})
				e.mustApply(plan(e.ep(1, 1)))
				want := "b"
				if !cleanup {
					want = "a" // stuck on the old endpoint
				}
				r, err = client.UDP(ap(vip, 53), 45000, waitResp)
				expect(t, "after the endpoint changed", r, err, want, client.IP)
				r, err = e.client.UDP(ap(e.node.LinkIP, 30053), 45000, waitResp)
				expect(t, "NodePort after the endpoint changed", r, err, want, netip.Addr{})
				if !cleanup {
					return
				}
				// b stops being chosen but still serves (terminating, or
				// out of a Local policy's set): a full sync keeps its
				// flows, as kube-proxy does.
				e.mustApply(plan(e.ep(2, 1), e.ep(1, 1)))
				r, err = client.UDP(ap(vip, 53), 45000, waitResp)
				expect(t, "live flow to a serving endpoint after a full sync", r, err, "b", client.IP)
				r, err = e.client.UDP(ap(e.node.LinkIP, 30053), 45000, waitResp)
				expect(t, "live NodePort flow to a serving endpoint after a full sync", r, err, "b", netip.Addr{})
			})
		}
	})
}

// TestUDPFirstEndpoint: datagrams sent before the service had any rules
// leave a conntrack entry that routes them nowhere; when the first
// endpoint appears, the entry is cleared and replies come back.
func TestUDPFirstEndpoint(t *testing.T) {
	eachVariant(t, func(t *testing.T, v iptables.Variant) {
		e := newEnv(t, v, 2, nil)
		client := e.pods[1]
		e.mustApply(&datapath.Plan{Full: true})
		for range 2 {
			if r, err := client.UDP(ap(vip, 53), 45001, waitDrop); err == nil {
				t.Fatalf("answered by %s before the service exists", r.Name)
			}
		}
		dns := fe("default/dns:", datapath.ClusterIP, datapath.UDP, vip, 53, e.ep(0, 1))
		dns.Serving = []netip.AddrPort{e.ep(0, 1).Addr}
		e.mustApply(&datapath.Plan{Frontends: []datapath.Frontend{dns}, Changed: map[datapath.ServicePortName]bool{{Namespace: "default", Name: "dns"}: true}})
		r, err := client.UDP(ap(vip, 53), 45001, waitResp)
		expect(t, "after the first endpoint", r, err, "a", client.IP)
	})
}

func TestPartialSync(t *testing.T) {
	eachVariant(t, func(t *testing.T, v iptables.Variant) {
		e := newEnv(t, v, 3, nil)
		c := e.pods[2]
		x := fe("default/x:", datapath.ClusterIP, datapath.TCP, vip, 80, e.ep(0, 1))
		x.Affinity = time.Minute // gives each endpoint a chain of its own
		y := fe("default/y:", datapath.ClusterIP, datapath.TCP, vip2, 80, e.ep(1, 1))
		xnp := fe("default/x:", datapath.NodePort, datapath.TCP, netip.Addr{}, 30080, e.ep(0, 1))
		e.mustApply(&datapath.Plan{Full: true, Frontends: []datapath.Frontend{x, xnp, y}})
		before := e.save()
		x.Endpoints = []datapath.Endpoint{e.ep(2, 1)}
		xnp.Endpoints = x.Endpoints
		e.mustApply(&datapath.Plan{Frontends: []datapath.Frontend{x, xnp, y}, Changed: map[datapath.ServicePortName]bool{{Namespace: "default", Name: "x"}: true}})
		r, err := e.client.TCP(ap(e.node.LinkIP, 30080), waitResp)
		expect(t, "changed service's NodePort", r, err, "c", netip.Addr{})
		r, err = c.TCP(ap(vip, 80), waitResp)
		expect(t, "changed service", r, err, "c", netip.Addr{})
		r, err = c.TCP(ap(vip2, 80), waitResp)
		expect(t, "unchanged service", r, err, "b", netip.Addr{})
		after := e.save()
		// The old endpoint's chain is gone, the unchanged service's chains stay.
		oldSEP := iptables.ChainName("SEP", iptables.ChainName("SVC", "default/x tcp cluster")+" "+e.pods[0].AddrPort(podPort).String())
		if !strings.Contains(before, oldSEP) || strings.Contains(after, oldSEP) {
			t.Fatalf("stale endpoint chain %s: before=%v after=%v", oldSEP, strings.Contains(before, oldSEP), strings.Contains(after, oldSEP))
		}
		// Deleting a service closes it and removes its chains.
		e.mustApply(&datapath.Plan{Frontends: []datapath.Frontend{y}, Changed: map[datapath.ServicePortName]bool{{Namespace: "default", Name: "x"}: true}})
		if _, err := c.TCP(ap(vip, 80), waitDrop); err == nil {
			t.Fatal("deleted service still answers")
		}
		if _, err := e.client.TCP(ap(e.node.LinkIP, 30080), 10*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("NodePort of the deleted service: %v, want connection refused (closed)", err)
		}
		if svc := iptables.ChainName("SVC", "default/x tcp cluster"); strings.Contains(e.save(), svc) {
			t.Fatalf("chain %s of the deleted service remains", svc)
		}
	})
}

// TestBadServiceIsolated: the kernel refuses one service's rules; the
// other services are still programmed, and the error names the bad one.
func TestBadServiceIsolated(t *testing.T) {
	eachVariant(t, func(t *testing.T, v iptables.Variant) {
		e := newEnv(t, v, 2, nil)
		iptables.BreakService(t, datapath.ServicePortName{Namespace: "default", Name: "bad"})
		for _, full := range []bool{true, false} {
			err := e.apply(e.p, &datapath.Plan{Full: full, Frontends: []datapath.Frontend{
				fe("default/bad:", datapath.ClusterIP, datapath.TCP, vip2, 80, e.ep(1, 1)),
				fe("default/good:", datapath.ClusterIP, datapath.TCP, vip, 80, e.ep(0, 1)),
			}})
			if err == nil || !strings.Contains(err.Error(), "default/bad tcp") {
				t.Fatalf("full=%v: apply error = %v, want one naming default/bad tcp", full, err)
			}
			r, err := e.pods[1].TCP(ap(vip, 80), waitResp)
			expect(t, "good service", r, err, "a", netip.Addr{})
		}
	})
}

func TestTamperedAndRepaired(t *testing.T) {
	eachVariant(t, func(t *testing.T, v iptables.Variant) {
		e := newEnv(t, v, 2, nil)
		plan := &datapath.Plan{Full: true, Frontends: []datapath.Frontend{
			fe("default/x:", datapath.ClusterIP, datapath.TCP, vip, 80, e.ep(0, 1)),
		}}
		e.mustApply(plan)
		tampered := func() bool {
			t.Helper()
			var got bool
			err := e.node.Do(func() error {
				var err error
				got, err = e.p.Tampered(context.Background())
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			return got
		}
		if tampered() {
			t.Fatal("Tampered right after apply")
		}
		// Nothing written since: the fingerprint answers, no iptables runs.
		checks := iptables.FullTamperChecks(e.p)
		if tampered() || iptables.FullTamperChecks(e.p) != checks {
			t.Fatalf("a quiet check ran iptables (%d full checks, was %d)", iptables.FullTamperChecks(e.p), checks)
		}
		// Our own writes do not call for a full check either.
		changed := &datapath.Plan{Changed: map[datapath.ServicePortName]bool{{Namespace: "default", Name: "x"}: true}, Frontends: []datapath.Frontend{
			fe("default/x:", datapath.ClusterIP, datapath.TCP, vip, 80, e.ep(1, 1)),
		}}
		e.mustApply(changed)
		e.mustApply(plan)
		if tampered() || iptables.FullTamperChecks(e.p) != checks {
			t.Fatalf("our own applies led to a full check (%d full checks, was %d)", iptables.FullTamperChecks(e.p), checks)
		}
		// Someone else's write changes the fingerprint: a full check, which
		// finds our rules intact.
		// (Slow checks are spaced out, so poll, bounded.)
		e.iptables("-t", "nat", "-N", "SOMEONE-ELSE")
		for deadline := time.Now().Add(15 * time.Second); iptables.FullTamperChecks(e.p) == checks && time.Now().Before(deadline); {
			if tampered() {
				t.Fatal("a foreign chain was taken for tampering")
			}
			time.Sleep(100 * time.Millisecond)
		}
		if iptables.FullTamperChecks(e.p) != checks+1 {
			t.Fatalf("a foreign write: want one full check (%d full checks, was %d)", iptables.FullTamperChecks(e.p), checks)
		}
		e.iptables("-t", "nat", "-X", "SOMEONE-ELSE")
		for _, flush := range [][]string{
			{"-t", "nat", "-F"},
			{"-t", "nat", "-F", "EP-SERVICES"},
			{"-t", "filter", "-F"},
			{"-t", "nat", "-D", "PREROUTING", "-m", "comment", "--comment", "edgeproxy service portals", "-j", "EP-SERVICES"},
		} {
			e.iptables(flush...)
			// The agent polls every few seconds; a check may be postponed
			// when checks are slow (see Tampered), so poll, bounded.
			detected := false
			for deadline := time.Now().Add(15 * time.Second); !detected && time.Now().Before(deadline); {
				if detected = tampered(); !detected {
					time.Sleep(100 * time.Millisecond)
				}
			}
			if !detected {
				t.Fatalf("iptables %s not detected within 15s", strings.Join(flush, " "))
			}
			// The agent answers with a full sync.
			e.mustApply(plan)
			if tampered() {
				t.Fatalf("still tampered after the repair of iptables %s", strings.Join(flush, " "))
			}
			r, err := e.pods[1].TCP(ap(vip, 80), waitResp)
			expect(t, "after repair", r, err, "a", netip.Addr{})
		}
		// A plan with Full set repairs a flush even when nobody asked
		// Tampered first; one without Full leaves it to the monitor.
		e.iptables("-t", "nat", "-F")
		e.mustApply(plan)
		if tampered() {
			t.Fatal("a Full plan did not repair a flushed nat table")
		}
		r, err := e.pods[1].TCP(ap(vip, 80), waitResp)
		expect(t, "after a Full plan", r, err, "a", netip.Addr{})
	})
}

// TestForeignRulesAndCleanup: rules and chains that are not ours survive
// syncs and Cleanup; Cleanup removes exactly ours.
func TestForeignRulesAndCleanup(t *testing.T) {
	eachVariant(t, func(t *testing.T, v iptables.Variant) {
		e := newEnv(t, v, 2, nil)
		e.iptables("-t", "nat", "-N", "FOREIGN")
		e.iptables("-t", "nat", "-A", "FOREIGN", "-d", "10.99.0.1/32", "-j", "RETURN")
		e.iptables("-t", "nat", "-A", "PREROUTING", "-d", "10.99.0.2/32", "-j", "FOREIGN")
		e.iptables("-t", "filter", "-A", "INPUT", "-s", "10.99.0.3/32", "-j", "ACCEPT")
		pristine := foreign(e.save())
		plan := &datapath.Plan{Full: true, Frontends: []datapath.Frontend{
			fe("default/x:", datapath.ClusterIP, datapath.TCP, vip, 80, e.ep(0, 1)),
			fe("default/y:", datapath.ClusterIP, datapath.TCP, vip2, 80),
		}}
		e.mustApply(plan)
		plan.Full = false
		e.mustApply(plan)
		if got := foreign(e.save()); got != pristine {
			t.Fatalf("foreign rules changed by apply:\nbefore:\n%s\nafter:\n%s", pristine, got)
		}
		if err := e.node.Do(func() error { return e.p.Cleanup(context.Background()) }); err != nil {
			t.Fatal(err)
		}
		s := e.save()
		if strings.Contains(s, iptables.Prefix) || strings.Contains(s, "edgeproxy") {
			t.Fatalf("Cleanup left rules of ours:\n%s", s)
		}
		if got := foreign(s); got != pristine {
			t.Fatalf("foreign rules changed by Cleanup:\nbefore:\n%s\nafter:\n%s", pristine, got)
		}
		// Cleanup twice is fine, and a later Apply starts from scratch.
		if err := e.node.Do(func() error { return e.p.Cleanup(context.Background()) }); err != nil {
			t.Fatal(err)
		}
		e.mustApply(plan)
		r, err := e.pods[1].TCP(ap(vip, 80), waitResp)
		expect(t, "after cleanup and apply", r, err, "a", netip.Addr{})
	})
}

// foreign returns the iptables-save lines that are not ours, without
// comments and counters.
func foreign(save string) string {
	var out []string
	for _, l := range strings.Split(save, "\n") {
		if strings.HasPrefix(l, "#") || strings.Contains(l, iptables.Prefix) || strings.Contains(l, "edgeproxy") {
			continue
		}
		if strings.HasPrefix(l, ":") {
			l = strings.Fields(l)[0]
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

// TestRestartAdopts starts a second Proxier over the first one's rules
// while a client keeps opening connections: none fails, and chains the new
// plan no longer wants are removed.
func TestRestartAdopts(t *testing.T) {
	eachVariant(t, func(t *testing.T, v iptables.Variant) {
		e := newEnv(t, v, 2, nil)
		x := fe("default/x:", datapath.ClusterIP, datapath.TCP, vip, 80, e.ep(0, 1))
		gone := fe("default/gone:", datapath.ClusterIP, datapath.TCP, vip2, 80, e.ep(0, 1))
		e.mustApply(&datapath.Plan{Full: true, Frontends: []datapath.Frontend{x, gone}})

		var ok, failed atomic.Int64
		var firstErr atomic.Value
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(time.Minute)
			for i := 0; i < 100000 && time.Now().Before(deadline); i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := e.pods[1].TCP(ap(vip, 80), waitResp); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				} else {
					ok.Add(1)
				}
			}
		}()
		for ok.Load() < 20 && failed.Load() == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		p2 := e.newProxier(nil)
		if err := e.apply(p2, &datapath.Plan{Full: true, Frontends: []datapath.Frontend{x}}); err != nil {
			t.Fatal(err)
		}
		after := ok.Load()
		for ok.Load() < after+20 && failed.Load() == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		close(stop)
		wg.Wait()
		if failed.Load() != 0 {
			t.Fatalf("%d of %d connections failed across the restart: %v", failed.Load(), ok.Load()+failed.Load(), firstErr.Load())
		}
		t.Logf("%d connections across the restart, none failed", ok.Load())
		if svc := iptables.ChainName("SVC", "default/gone tcp cluster"); strings.Contains(e.save(), svc) {
			t.Fatalf("chain %s of a service absent from the new plan remains", svc)
		}
	})
}

func TestRefusesBothBackends(t *testing.T) {
	gate.Root(t)
	gate.Binaries(t, "iptables", "iptables-legacy", "iptables-nft", "iptables-restore")
	node := netns.NewNode(t, "node")
	for _, bin := range []string{"iptables-legacy", "iptables-nft"} {
		if _, err := node.Run(bin, "-t", "nat", "-N", "EP-SERVICES"); err != nil {
			t.Fatal(err)
		}
	}
	err := node.Do(func() error {
		_, err := iptables.New(iptables.Options{MasqueradeBit: 14, NoConntrack: true})
		return err
	})
	if !errors.Is(err, iptables.ErrBothBackends) {
		t.Fatalf("New = %v, want ErrBothBackends", err)
	}
	// CleanupAll needs no Proxier and clears both.
	if err := node.Do(func() error { return iptables.CleanupAll(context.Background(), nil) }); err != nil {
		t.Fatal(err)
	}
	for _, bin := range []string{"iptables-legacy-save", "iptables-nft-save"} {
		if out, err := node.Run(bin); err != nil || strings.Contains(out, iptables.Prefix) {
			t.Fatalf("%s after CleanupAll (%v):\n%s", bin, err, out)
		}
	}
	if err := node.Do(func() error {
		_, err := iptables.New(iptables.Options{MasqueradeBit: 14, NoConntrack: true})
		return err
	}); err != nil {
		t.Fatalf("New after CleanupAll: %v", err)
	}
}

func TestSysctls(t *testing.T) {
	eachVariant(t, func(t *testing.T, v iptables.Variant) {
		node := netns.NewNode(t, "node")
		if err := node.Sysctl("net/ipv4/ip_forward", "0"); err != nil {
			t.Fatal(err)
		}
		var p *iptables.Proxier
		err := node.Do(func() error {
			var err error
			p, err = iptables.New(iptables.Options{Variant: v, MasqueradeBit: 14, LocalhostNodePorts: true, NoConntrack: true})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.SysctlErrors(); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"net.ipv4.ip_forward", "net.ipv4.conf.all.route_localnet"} {
			var got string
			if err := node.Do(func() (err error) { got, err = sysctl.Get(k); return err }); err != nil {
				t.Fatal(err)
			}
			if got != "1" {
				t.Errorf("%s = %q in the node, want 1", k, got)
			}
		}
	})
}

func TestMetrics(t *testing.T) {
	gate.Root(t)
	gate.Binaries(t, "iptables", "iptables-restore")
	node := netns.NewNode(t, "node")
	reg := prometheus.NewRegistry()
	var p *iptables.Proxier
	if err := node.Do(func() (err error) {
		p, err = iptables.New(iptables.Options{MasqueradeBit: 14, Registerer: reg})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	plan := &datapath.Plan{Full: true, Frontends: []datapath.Frontend{
		fe("default/x:", datapath.ClusterIP, datapath.UDP, vip, 53, datapath.Endpoint{Addr: netip.MustParseAddrPort("10.244.0.2:53"), Weight: 1}),
	}}
	for _, full := range []bool{true, false} {
		plan.Full = full
		if err := node.Do(func() error { return p.Apply(context.Background(), plan) }); err != nil {
			t.Fatal(err)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		got[mf.GetName()] = true
	}
	for _, name := range []string{iptables.MetricRules, iptables.MetricRestoreFailures, iptables.MetricPartialFailures,
		iptables.MetricFullDuration, iptables.MetricPartialDuration, iptables.MetricRestoreBytes,
		conntrack.MetricDeleted, conntrack.MetricDuration} {
		if !got[name] {
			t.Errorf("metric %s not registered", name)
		}
	}
}

func TestIPv6(t *testing.T) {
	eachVariant(t, func(t *testing.T, v iptables.Variant) {
		gate.Binaries(t, "ip6tables-"+string(v), "ip6tables-"+string(v)+"-restore")
		e := newEnv(t, v, 3, func(o *iptables.Options) {
			o.IPv6 = true
			o.ClusterCIDRs = append(o.ClusterCIDRs, netip.MustParsePrefix("fd00:244::/64"))
			// IPv4 CIDRs only: IPv6 node ports stay on every address.
			o.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("192.168.77.0/24")}
		})
		a, c := e.pods[0], e.pods[2]
		vip6, empty6 := netip.MustParseAddr("fd00:96::10"), netip.MustParseAddr("fd00:96::11")
		ep6 := func(i int) datapath.Endpoint {
			return datapath.Endpoint{Addr: e.pods[i].AddrPort6(podPort), Weight: 1, Local: true}
		}
		f6 := func(svc string, kind datapath.Kind, proto datapath.Protocol, addr netip.Addr, port uint16, eps ...datapath.Endpoint) datapath.Frontend {
			f := fe(svc, kind, proto, addr, port, eps...)
			f.Family = datapath.IPv6
			return f
		}
		e.mustApply(&datapath.Plan{Full: true, Frontends: []datapath.Frontend{
			f6("default/web:tcp", datapath.ClusterIP, datapath.TCP, vip6, 80, ep6(0)),
			f6("default/web:udp", datapath.ClusterIP, datapath.UDP, vip6, 80, ep6(1)),
			f6("default/web:tcp", datapath.NodePort, datapath.TCP, netip.Addr{}, 30080, ep6(0)),
			f6("default/empty:", datapath.ClusterIP, datapath.TCP, empty6, 80),
			// The IPv4 side of a dual-stack service, programmed alongside.
			fe("default/web:tcp", datapath.ClusterIP, datapath.TCP, vip, 80, e.ep(1, 1)),
		}})
		r, err := c.TCP(ap(vip6, 80), waitResp)
		expect(t, "pod c -> IPv6 ClusterIP tcp", r, err, "a", c.IP6)
		r, err = c.UDP(ap(vip6, 80), 0, waitResp)
		expect(t, "pod c -> IPv6 ClusterIP udp", r, err, "b", c.IP6)
		r, err = c.TCP(ap(vip, 80), waitResp)
		expect(t, "pod c -> IPv4 ClusterIP of the same service", r, err, "b", c.IP)
		r, err = e.client.TCP(ap(e.node.LinkIP6, 30080), waitResp)
		expect(t, "client -> IPv6 NodePort", r, err, "a", e.node.Gateway6)
		r, err = a.TCP(ap(vip6, 80), waitResp)
		expect(t, "pod a -> IPv6 ClusterIP -> pod a (hairpin)", r, err, "a", e.node.Gateway6)
		if _, err := c.TCP(ap(empty6, 80), 10*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("IPv6 ClusterIP without endpoints: %v, want connection refused", err)
		}
	})
}

// TestNoOpSync: applying the same plan again writes nothing, with or
// without Full (Full compares everything but finds nothing to write).
func TestNoOpSync(t *testing.T) {
	gate.Root(t)
	gate.Binaries(t, "iptables", "iptables-restore")
	node := netns.NewNode(t, "node")
	reg := prometheus.NewRegistry()
	var p *iptables.Proxier
	if err := node.Do(func() (err error) {
		p, err = iptables.New(iptables.Options{MasqueradeBit: 14, NoConntrack: true, Registerer: reg, ClusterCIDRs: []netip.Prefix{clusterCIDR}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	plan := benchPlan(20, 0)
	for i, full := range []bool{false, false, true} {
		plan.Full = full
		if err := node.Do(func() error { return p.Apply(context.Background(), plan) }); err != nil {
			t.Fatal(err)
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != iptables.MetricRestoreBytes {
				continue
			}
			n := mf.GetMetric()[0].GetGauge().GetValue()
			if i == 0 && n < 1000 || i > 0 && n > 30 {
				t.Errorf("apply %d (full=%v): restore input of %v bytes", i, full, n)
			}
		}
	}
}

// TestLocalnetMartians: with localhost NodePorts the proxier turns on
// route_localnet, which lets packets to 127.0.0.0/8 arrive from outside
// (CVE-2020-8558). A client that routes 127.0.0.0/8 to the node must not
// reach a loopback-only listener there; the rule's packet counter shows
// it is what stopped them.
func TestLocalnetMartians(t *testing.T) {
	eachVariant(t, func(t *testing.T, v iptables.Variant) {
		e := newEnv(t, v, 1, nil)
		e.mustApply(&datapath.Plan{Full: true, Frontends: []datapath.Frontend{
			fe("default/web:", datapath.NodePort, datapath.TCP, netip.Addr{}, 30080, e.ep(0, 1)),
		}})
		e.listenInNode("127.0.0.1:9999")
		// The client sends 127.0.0.0/8 to the node instead of its own lo.
		for _, args := range [][]string{
			{"route", "del", "local", "127.0.0.0/8", "dev", "lo", "table", "local"},
			{"route", "del", "local", "127.0.0.1", "dev", "lo", "table", "local"},
			{"route", "add", "127.0.0.0/8", "via", e.node.LinkIP.String()},
		} {
			if out, err := e.client.Run("ip", args...); err != nil {
				t.Fatalf("ip %v: %v: %s", args, err, out)
			}
		}
		if err := e.client.Sysctl("net/ipv4/conf/all/route_localnet", "1"); err != nil {
			t.Fatal(err)
		}
		// The martians must reach the node and be dropped by the rule, not
		// be lost on the way: its packet counter moves. A loaded machine
		// may give up on a connect before its first SYN has left (the
		// neighbour is still being resolved), so try a few times; no
		// attempt may connect.
		dropped := 0
		for try := 0; try < 5 && dropped == 0; try++ {
			if err := connect(e.client, netip.MustParseAddrPort("127.0.0.1:9999")); err == nil {
				t.Fatal("client -> node 127.0.0.1:9999 connected: martian to localnet not dropped")
			}
			for _, l := range strings.Split(e.iptables("-t", "filter", "-L", "EP-LOCALNET", "-v", "-x", "-n"), "\n") {
				if f := strings.Fields(l); len(f) > 2 && f[2] == "DROP" {
					dropped, _ = strconv.Atoi(f[0])
				}
			}
		}
		if dropped == 0 {
			t.Fatal("the localnet rule dropped no packet in 5 tries: the martians never reached the node")
		}
		// The node itself still reaches its localhost NodePort.
		r, err := e.node.TCP(ap(netip.MustParseAddr("127.0.0.1"), 30080), waitResp)
		expect(t, "node -> localhost NodePort", r, err, "a", netip.Addr{})
	})
}

// TestNodePortAddresses: node ports answer on the node's own addresses
// inside nodePortAddresses, not on every address of the range (a pod
// sending to another host of the range through the node must not be
// DNATed), and "primary" adds the node's primary address.
func TestNodePortAddresses(t *testing.T) {
	eachVariant(t, func(t *testing.T, v iptables.Variant) {
		e := newEnv(t, v, 2, func(o *iptables.Options) {
			o.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("192.168.77.0/24")}
		})
		np := []datapath.Frontend{fe("default/web:", datapath.NodePort, datapath.TCP, netip.Addr{}, 30080, e.ep(0, 1))}
		e.mustApply(&datapath.Plan{Full: true, Frontends: np})
		r, err := e.client.TCP(ap(e.node.LinkIP, 30080), waitResp)
		expect(t, "client -> NodePort on the node's address in the range", r, err, "a", netip.Addr{})
		other := netip.MustParseAddr("192.168.77.9") // in the range, not the node's
		if r, err := e.pods[1].TCP(ap(other, 30080), waitDrop); err == nil {
			t.Fatalf("pod -> %s:30080 (another host of nodePortAddresses) was DNATed to %s", other, r.Name)
		}
		if r, err := e.pods[1].TCP(ap(e.node.Gateway, 30080), waitDrop); err == nil {
			t.Fatalf("pod -> NodePort on the bridge address (outside nodePortAddresses) answered by %s", r.Name)
		}

		// primary: a range without node addresses, plus the primary IP.
		p := e.newProxier(func(o *iptables.Options) {
			o.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("10.99.0.0/16")}
			o.NodePortPrimary = true
		})
		if err := e.apply(p, &datapath.Plan{Full: true, Frontends: np, NodeIPs: []netip.Addr{e.node.Gateway}}); err != nil {
			t.Fatal(err)
		}
		r, err = e.pods[1].TCP(ap(e.node.Gateway, 30080), waitResp)
		expect(t, "pod -> NodePort on the primary address", r, err, "a", netip.Addr{})
		if r, err := e.client.TCP(ap(e.node.LinkIP, 30080), waitDrop); err == nil {
			t.Fatalf("client -> NodePort on a non-primary address answered by %s", r.Name)
		}
	})
}

// TestHealthCheckPortAccepted: a node whose INPUT policy drops everything
// still lets load balancers reach the healthCheckNodePorts, as kube-proxy's
// filter KUBE-NODEPORTS ACCEPT does.
func TestHealthCheckPortAccepted(t *testing.T) {
	eachVariant(t, func(t *testing.T, v iptables.Variant) {
		e := newEnv(t, v, 1, nil)
		e.listenInNode(":32000")
		e.iptables("-P", "INPUT", "DROP")
		dial := func() error { return connect(e.client, ap(e.node.LinkIP, 32000)) }
		e.mustApply(&datapath.Plan{Full: true})
		if err := dial(); err == nil {
			t.Fatal("control: INPUT policy DROP let the port through without a health check port in the plan")
		}
		e.mustApply(&datapath.Plan{Full: true, HealthCheckPorts: []uint16{32000}})
		if err := dial(); err != nil {
			t.Fatalf("health check node port with INPUT policy DROP: %v", err)
		}
	})
}

// listenInNode opens a TCP listener in the node until the test ends; the
// kernel completes handshakes for it, which is all connect looks at.
func (e *env) listenInNode(addr string) {
	e.t.Helper()
	var ln net.Listener
	if err := e.node.Do(func() error {
		var err error
		ln, err = net.Listen("tcp4", addr)
		return err
	}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { ln.Close() })
}

// connect reports whether a TCP handshake from ns to dst completes within
// waitDrop.
func connect(ns *netns.NS, dst netip.AddrPort) error {
	return ns.Do(func() error {
		c, err := net.DialTimeout("tcp", dst.String(), waitDrop)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// TestNFTNodeKeepsNoLegacyTables: on a node whose rules are in
// iptables-nft, starting, applying and cleaning up never make the kernel's
// legacy x_tables (listing one with iptables-legacy creates it), so
// iptables-nft-save does not warn "iptables-legacy tables present" after
// edgeproxy ran or left.
func TestNFTNodeKeepsNoLegacyTables(t *testing.T) {
	gate.Root(t)
	gate.Binaries(t, "iptables-legacy", "iptables-nft", "iptables-nft-restore", "iptables-nft-save")
	node := netns.NewNode(t, "node")
	legacy := func(when string) {
		t.Helper()
		for _, f := range []string{"/proc/net/ip_tables_names", "/proc/net/ip6_tables_names"} {
			out, err := node.Run("cat", f)
			if err != nil {
				continue // the module is not loaded: no table
			}
			if strings.TrimSpace(out) != "" {
				t.Fatalf("%s: %s lists %q", when, f, strings.Fields(out))
			}
		}
	}
	legacy("a new namespace")
	if err := node.Do(func() error {
		p, err := iptables.New(iptables.Options{Variant: iptables.NFT, IPv6: true, MasqueradeBit: 14, NoConntrack: true})
		if err != nil {
			return err
		}
		return p.Apply(context.Background(), &datapath.Plan{Full: true})
	}); err != nil {
		t.Fatal(err)
	}
	if out, err := node.Run("iptables-nft-save", "-t", "nat"); err != nil || !strings.Contains(out, iptables.Prefix) {
		t.Fatalf("no edgeproxy chain under iptables-nft after an apply (%v):\n%s", err, out)
	}
	legacy("after New and Apply on iptables-nft")
	if err := node.Do(func() error { return iptables.CleanupAll(context.Background(), nil) }); err != nil {
		t.Fatal(err)
	}
	if out, err := node.Run("iptables-nft-save", "-t", "nat"); err != nil || strings.Contains(out, iptables.Prefix) {
		t.Fatalf("iptables-nft-save after CleanupAll (%v):\n%s", err, out)
	}
	legacy("after CleanupAll")
}
