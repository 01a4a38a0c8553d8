package ipvs

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/ipset"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/internal/testkit/vm"
)

// These tests need IPVS and dummy links, so they run inside the test VM
// (test/vm's TestGuestPackages); on the host they skip.

const timeout = 3 * time.Second

type world struct {
	t      *testing.T
	node   *netns.Node
	client *netns.NS
	pods   map[string]*netns.Pod
	p      *Proxier
	clock  *fakeClock
}

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// newWorld builds a node namespace with pods serving TCP and UDP echo on
// 8080, an outside client, and a Proxier inside the node namespace.
func newWorld(t *testing.T, pods ...string) *world {
	t.Helper()
	vm.Guest(t)
	gate.Root(t)
	gate.Binaries(t, "iptables", "iptables-restore", "iptables-save")
	w := &world{t: t, node: netns.NewNode(t, "node"), pods: map[string]*netns.Pod{}, clock: &fakeClock{now: time.Unix(1_700_000_000, 0)}}
	w.client = w.node.AddClient("cl")
	for _, name := range pods {
		pod := w.node.AddPod(name)
		if err := pod.Serve(8080); err != nil {
			t.Fatal(err)
		}
		w.pods[name] = pod
	}
	w.p = w.newProxier(Options{GracePeriod: 10 * time.Second, ClusterCIDRs: []netip.Prefix{w.node.PodNet}})
	return w
}

func (w *world) newProxier(o Options) *Proxier {
	w.t.Helper()
	o.Now = w.clock.Now
	var p *Proxier
	if err := w.node.Do(func() error {
		var err error
		p, err = New(o)
		return err
	}); err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { p.Close() })
	return p
}

func (w *world) apply(p *Proxier, plan *datapath.Plan) {
	w.t.Helper()
	plan.Sort()
	if err := plan.Validate(); err != nil {
		w.t.Fatal(err)
	}
	if err := w.node.Do(func() error { return p.Apply(context.Background(), plan) }); err != nil {
		w.t.Fatalf("apply: %v", err)
	}
}

func (w *world) ep(pod string, weight uint32) datapath.Endpoint {
	return datapath.Endpoint{Addr: w.pods[pod].AddrPort(8080), Weight: weight, Local: true}
}

func (w *world) kernel() map[Key]struct {
	VS    VirtualServer
	Reals []RealServer
} {
	w.t.Helper()
	out := map[Key]struct {
		VS    VirtualServer
		Reals []RealServer
	}{}
	err := w.node.Do(func() error {
		k, err := Open()
		if err != nil {
			return err
		}
		defer k.Close()
		vss, err := k.VirtualServers()
		if err != nil {
			return err
		}
		for _, v := range vss {
			rs, err := k.RealServers(v)
			if err != nil {
				return err
			}
			slices.SortFunc(rs, func(a, b RealServer) int { return a.Addr.Compare(b.Addr) })
			out[v.Key()] = struct {
				VS    VirtualServer
				Reals []RealServer
			}{v, rs}
		}
		return nil
	})
	if err != nil {
		w.t.Fatal(err)
	}
	return out
}

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }
func ap(a string, port uint16) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(a), port)
}

// podReachesBoth makes 6 TCP connections from pod "client" to dst and
// wants them answered by both a and b, each seeing src (no SNAT inside
// the cluster).
func (w *world) podReachesBoth(dst netip.AddrPort, src netip.Addr) {
	w.t.Helper()
	seen := map[string]bool{}
	for range 6 {
		r, err := w.pods["client"].TCP(dst, timeout)
		if err != nil {
			w.t.Fatalf("pod -> %s TCP: %v", dst, err)
		}
		seen[r.Name] = true
		if r.Client.Addr() != src {
			w.t.Errorf("pod -> %s: endpoint saw %s, want the pod's own address %s (no SNAT inside the cluster)", dst, r.Client, src)
		}
	}
	if !seen["a"] || !seen["b"] || len(seen) != 2 {
		w.t.Errorf("%s TCP answered by %v, want a and b", dst, seen)
	}
}

func TestClusterIPAndNodePortTraffic(t *testing.T) {
	w := newWorld(t, "a", "b", "c", "client")
	plan := &datapath.Plan{Full: true, Frontends: []datapath.Frontend{
		{Service: datapath.ServicePortName{Namespace: "default", Name: "web", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: addr("10.96.0.10"), Family: datapath.IPv4, Port: 80,
			Endpoints: []datapath.Endpoint{w.ep("a", 1), w.ep("b", 1)}},
		{Service: datapath.ServicePortName{Namespace: "default", Name: "dns", Port: "dns"}, Kind: datapath.ClusterIP, Protocol: datapath.UDP, Addr: addr("10.96.0.53"), Family: datapath.IPv4, Port: 53,
			Endpoints: []datapath.Endpoint{w.ep("c", 1)}},
		{Service: datapath.ServicePortName{Namespace: "default", Name: "np", Port: "http"}, Kind: datapath.NodePort, Protocol: datapath.TCP, Family: datapath.IPv4, Port: 30080,
			Endpoints: []datapath.Endpoint{w.ep("c", 1)}},
		{Service: datapath.ServicePortName{Namespace: "default", Name: "empty", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: addr("10.96.0.99"), Family: datapath.IPv4, Port: 80},
	}}
	w.apply(w.p, plan)

	// TCP from a pod and from outside: answered by a or b, both seen.
	w.podReachesBoth(ap("10.96.0.10", 80), w.pods["client"].IP)
	r, err := w.client.TCP(ap("10.96.0.10", 80), timeout)
	if err != nil || (r.Name != "a" && r.Name != "b") {
		t.Errorf("outside client -> ClusterIP TCP: %v %v", r, err)
	} else if r.Client.Addr() == addr("192.168.77.2") {
		t.Errorf("outside client -> ClusterIP kept its source %s; it must be masqueraded (outside the cluster range)", r.Client)
	}
	// UDP answered by c.
	u, err := w.pods["client"].UDP(ap("10.96.0.53", 53), 0, timeout)
	if err != nil || u.Name != "c" {
		t.Errorf("ClusterIP UDP: %v %v, want c", u, err)
	}
	// NodePort on the node's client-facing address, masqueraded.
	n, err := w.client.TCP(netip.AddrPortFrom(w.node.LinkIP, 30080), timeout)
	if err != nil || n.Name != "c" {
		t.Errorf("NodePort: %v %v, want c", n, err)
	} else if n.Client.Addr() == addr("192.168.77.2") {
		t.Errorf("NodePort with policy Cluster kept the client's source %s", n.Client)
	}
	// No endpoints: refused, not timed out.
	start := time.Now()
	_, err = w.pods["client"].TCP(ap("10.96.0.99", 80), timeout)
	if err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("service without endpoints: err = %v, want connection refused", err)
	}
	t.Logf("refusal took %s", time.Since(start))

	// The kernel holds one virtual server per frontend and node address.
	k := w.kernel()
	if _, ok := k[Key{addr("10.96.0.10"), datapath.TCP, 80}]; !ok {
		t.Errorf("kernel lacks the ClusterIP virtual server; has %v", k)
	}
	for _, a := range []netip.Addr{w.node.Gateway, w.node.LinkIP} {
		if v, ok := k[Key{a, datapath.TCP, 30080}]; !ok || len(v.Reals) != 1 {
			t.Errorf("NodePort virtual server on %s: %v", a, v)
		}
	}

	// Metrics follow the kernel.
	if got := testutil.ToFloat64(w.p.m.virtualServers); got != 5 {
		t.Errorf("%s = %v, want 5 (3 frontends with an address, a NodePort on 2 node addresses)", MetricVirtualServers, got)
	}

	// Applying the same plan again changes nothing.
	w.apply(w.p, plan)
	st := w.p.LastStats()
	if changes := st.Ops() - st.Reads; changes != 0 {
		t.Errorf("second apply of the same plan made %d changes: %+v", changes, st)
	}
}

// TestDualStack: with IPv6 on, IPv6 frontends become IPv6 virtual servers
// with IPv6 addresses on the dummy link, EP-6- sets and ip6tables rules,
// and carry real IPv6 traffic: ClusterIP TCP and UDP from a pod (source
// kept) and from outside (masqueraded), NodePort, a refusal without
// endpoints; the IPv4 half of the same service works beside it.
func TestDualStack(t *testing.T) {
	w := newWorld(t, "a", "b", "c", "client")
	gate.Binaries(t, "ip6tables", "ip6tables-restore", "ip6tables-save")
	p := w.newProxier(Options{IPv6: true, ClusterCIDRs: []netip.Prefix{w.node.PodNet, netip.MustParsePrefix("fd00:244::/64")}})
	ep6 := func(pod string) datapath.Endpoint {
		return datapath.Endpoint{Addr: w.pods[pod].AddrPort6(8080), Weight: 1, Local: true}
	}
	vip6, dns6, empty6 := netip.AddrPortFrom(addr("fd00:96::10"), 80), netip.AddrPortFrom(addr("fd00:96::53"), 53), netip.AddrPortFrom(addr("fd00:96::99"), 80)
	plan := &datapath.Plan{Full: true, Frontends: []datapath.Frontend{
		{Service: datapath.ServicePortName{Namespace: "default", Name: "web", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: addr("10.96.0.10"), Family: datapath.IPv4, Port: 80,
			Endpoints: []datapath.Endpoint{w.ep("a", 1)}},
		{Service: datapath.ServicePortName{Namespace: "default", Name: "web", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: vip6.Addr(), Family: datapath.IPv6, Port: 80,
			Endpoints: []datapath.Endpoint{ep6("a"), ep6("b")}},
		{Service: datapath.ServicePortName{Namespace: "default", Name: "dns", Port: "dns"}, Kind: datapath.ClusterIP, Protocol: datapath.UDP, Addr: dns6.Addr(), Family: datapath.IPv6, Port: 53,
			Endpoints: []datapath.Endpoint{ep6("c")}},
		{Service: datapath.ServicePortName{Namespace: "default", Name: "np", Port: "http"}, Kind: datapath.NodePort, Protocol: datapath.TCP, Family: datapath.IPv6, Port: 30080,
			Endpoints: []datapath.Endpoint{ep6("c")}},
		{Service: datapath.ServicePortName{Namespace: "default", Name: "empty", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: empty6.Addr(), Family: datapath.IPv6, Port: 80},
	}}
	w.apply(p, plan)

	w.podReachesBoth(vip6, w.pods["client"].IP6)
	if r, err := w.client.TCP(vip6, timeout); err != nil || (r.Name != "a" && r.Name != "b") {
		t.Errorf("outside client -> IPv6 ClusterIP: %v %v", r, err)
	} else if r.Client.Addr() == addr("fd00:77::2") {
		t.Errorf("outside client -> IPv6 ClusterIP kept its source %s; it must be masqueraded", r.Client)
	}
	if u, err := w.pods["client"].UDP(dns6, 0, timeout); err != nil || u.Name != "c" {
		t.Errorf("IPv6 ClusterIP UDP: %v %v, want c", u, err)
	}
	if n, err := w.client.TCP(netip.AddrPortFrom(w.node.LinkIP6, 30080), timeout); err != nil || n.Name != "c" {
		t.Errorf("IPv6 NodePort: %v %v, want c", n, err)
	} else if n.Client.Addr() == addr("fd00:77::2") {
		t.Errorf("IPv6 NodePort with policy Cluster kept the client's source %s", n.Client)
	}
	if _, err := w.pods["client"].TCP(empty6, timeout); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("IPv6 service without endpoints: err = %v, want connection refused", err)
	}
	if r, err := w.pods["client"].TCP(ap("10.96.0.10", 80), timeout); err != nil || r.Name != "a" {
		t.Errorf("the IPv4 half beside it: %v %v, want a", r, err)
	}

	// The kernel: IPv6 virtual servers (also NodePorts on the node's IPv6
	// addresses), IPv6 VIPs on the dummy link, EP-6- sets, ip6tables.
	k := w.kernel()
	if v := k[Key{vip6.Addr(), datapath.TCP, 80}]; len(v.Reals) != 2 || !v.Reals[0].Addr.Addr().Is6() {
		t.Errorf("IPv6 ClusterIP virtual server: %+v", v)
	}
	if v := k[Key{w.node.LinkIP6, datapath.TCP, 30080}]; len(v.Reals) != 1 {
		t.Errorf("IPv6 NodePort virtual server on %s: %+v", w.node.LinkIP6, v)
	}
	if out, err := w.node.Run("ip", "-6", "addr", "show", "dev", "edgeproxy0"); err != nil || !strings.Contains(out, "fd00:96::10/128") {
		t.Errorf("IPv6 VIP on the dummy link: %v\n%s", err, out)
	}
	var entries []ipset.Entry
	if err := w.node.Do(func() error {
		s, es, ok, err := ipset.Netlink{}.Get(setName(setClusterIP, datapath.IPv6))
		if err == nil && (!ok || s.Family != datapath.IPv6) {
			err = fmt.Errorf("set %+v, exists %v", s, ok)
		}
		entries = es
		return err
	}); err != nil || len(entries) != 3 {
		t.Errorf("IPv6 ClusterIP set: %v, entries %v", err, entries)
	}
	if out, err := w.node.Run("ip6tables-save", "-t", "nat"); err != nil || !strings.Contains(out, "EP-6-CLUSTER-IP") {
		t.Errorf("ip6tables rules: %v\n%s", err, out)
	}
	if out, err := w.node.Run("ipvsadm", "-Ln"); err == nil {
		t.Logf("ipvsadm -Ln:\n%s", out)
	}

	// Cleanup removes both families.
	if err := w.node.Do(func() error { return p.Cleanup(context.Background()) }); err != nil {
		t.Fatal(err)
	}
	if out, _ := w.node.Run("ip6tables-save"); strings.Contains(out, "EP-") {
		t.Errorf("ip6tables after cleanup:\n%s", out)
	}
}

func TestWeightsAndSchedulerReachTheKernel(t *testing.T) {
	w := newWorld(t, "a", "b", "client")
	plan := &datapath.Plan{Full: true, Frontends: []datapath.Frontend{
		{Service: datapath.ServicePortName{Namespace: "default", Name: "canary", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: addr("10.96.1.1"), Family: datapath.IPv4, Port: 80,
			Endpoints: []datapath.Endpoint{w.ep("a", 3), w.ep("b", 1)}},
		{Service: datapath.ServicePortName{Namespace: "default", Name: "sticky", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: addr("10.96.1.2"), Family: datapath.IPv4, Port: 80,
			Scheduler: "sh", SchedulerFlags: []string{"sh-port"},
			Endpoints: []datapath.Endpoint{w.ep("a", 1), w.ep("b", 1)}},
		{Service: datapath.ServicePortName{Namespace: "default", Name: "affinity", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: addr("10.96.1.3"), Family: datapath.IPv4, Port: 80,
			Affinity: 3 * time.Hour, Endpoints: []datapath.Endpoint{w.ep("a", 1), w.ep("b", 1)}},
	}}
	w.apply(w.p, plan)
	k := w.kernel()
	canary := k[Key{addr("10.96.1.1"), datapath.TCP, 80}]
	if canary.VS.Scheduler != "wrr" {
		t.Errorf("unequal weights with default rr: kernel scheduler %q, want wrr", canary.VS.Scheduler)
	}
	var weights []int
	for _, r := range canary.Reals {
		weights = append(weights, r.Weight)
	}
	if !slices.Equal(weights, []int{3, 1}) { // a (.2) sorts before b (.3)
		t.Errorf("kernel weights %v, want [3 1]", weights)
	}
	if v := k[Key{addr("10.96.1.2"), datapath.TCP, 80}].VS; v.Scheduler != "sh" || v.Flags&FlagSched2 == 0 {
		t.Errorf("policy scheduler: kernel has %v, want sh with sh-port", v)
	}
	if v := k[Key{addr("10.96.1.3"), datapath.TCP, 80}].VS; v.Flags&FlagPersistent == 0 || v.Timeout != 10800 {
		t.Errorf("affinity: kernel has %v, want persistent 10800", v)
	}
	if _, err := exec.LookPath("ipvsadm"); err == nil {
		out, err := w.node.Run("ipvsadm", "-Ln")
		t.Logf("ipvsadm -Ln:\n%s", out)
		if err != nil || !strings.Contains(out, "10.96.1.1:80 wrr") || !strings.Contains(out, "Masq    3") {
			t.Errorf("ipvsadm -Ln does not show wrr with weight 3: %v", err)
		}
	}

	// The split: 400 new connections, 3:1 within 5 percentage points.
	const total = 400
	count := map[string]int{}
	for range total {
		r, err := w.client.TCP(ap("10.96.1.1", 80), timeout)
		if err != nil {
			t.Fatalf("connection: %v", err)
		}
		count[r.Name]++
	}
	share := float64(count["a"]) / total
	t.Logf("split over %d connections: %v (a's share %.3f, want 0.75)", total, count, share)
	if share < 0.70 || share > 0.80 {
		t.Errorf("a answered %.1f%% of connections, want 75%% ± 5", share*100)
	}

	// Persistence: one client keeps its endpoint.
	first, err := w.client.TCP(ap("10.96.1.3", 80), timeout)
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		r, err := w.client.TCP(ap("10.96.1.3", 80), timeout)
		if err != nil || r.Name != first.Name {
			t.Fatalf("affinity broke: %v %v, first was %s", r, err, first.Name)
		}
	}
}

// holdServer accepts TCP connections on port in pod and echoes lines back
// until the client closes.
func holdServer(t *testing.T, pod *netns.Pod, port uint16) {
	t.Helper()
	var mu sync.Mutex
	var conns []net.Conn
	closed := false
	serveConns(t, listenTCP(t, pod.NS, port), func(c net.Conn) {
		mu.Lock()
		if closed { // accepted while the test ended
			mu.Unlock()
			return
		}
		conns = append(conns, c)
		mu.Unlock()
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			fmt.Fprintf(c, "%s %s\n", pod.PodName, sc.Text())
		}
	})
	// Runs before serveConns' cleanup waits for the handlers: a peer cut
	// off by a deleted real server never sends FIN.
	t.Cleanup(func() {
		mu.Lock()
		closed = true
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
}

// dial opens a TCP connection from ns to dst, closed when the test ends.
func dial(t *testing.T, ns *netns.NS, dst netip.AddrPort) net.Conn {
	t.Helper()
	var c net.Conn
	if err := ns.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp", dst.String(), timeout)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func talk(ns *netns.NS, dst netip.AddrPort, msg string) (string, error) {
	var c net.Conn
	if err := ns.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp", dst.String(), timeout)
		return err
	}); err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := fmt.Fprintf(c, "%s\n", msg); err != nil {
		return "", err
	}
	return bufio.NewReader(c).ReadString('\n')
}

// drainPair returns builders of the two frontends the graceful termination
// tests remove endpoints from: TCP service svc on vip:80 to the named
// pods' podPort, and UDP default/dns:udp on vip:53 to their echo port.
func (w *world) drainPair(svc datapath.ServicePortName, vip netip.Addr, podPort uint16) (tcp, udp func(pods ...string) datapath.Frontend) {
	build := func(svc datapath.ServicePortName, proto datapath.Protocol, port, podPort uint16) func(pods ...string) datapath.Frontend {
		return func(pods ...string) datapath.Frontend {
			f := datapath.Frontend{Service: svc, Kind: datapath.ClusterIP, Protocol: proto, Addr: vip, Family: datapath.IPv4, Port: port}
			for _, p := range pods {
				f.Endpoints = append(f.Endpoints, datapath.Endpoint{Addr: w.pods[p].AddrPort(podPort), Weight: 1})
			}
			return f
		}
	}
	return build(svc, datapath.TCP, 80, podPort), build(datapath.ServicePortName{Namespace: "default", Name: "dns", Port: "udp"}, datapath.UDP, 53, 8080)
}

func TestGracefulTermination(t *testing.T) {
	w := newWorld(t, "a", "b", "c", "d")
	for _, p := range []string{"a", "b"} {
		holdServer(t, w.pods[p], 9090)
	}
	vip := ap("10.96.2.1", 80)
	tcp, udp := w.drainPair(datapath.ServicePortName{Namespace: "default", Name: "hold", Port: "tcp"}, vip.Addr(), 9090)
	w.apply(w.p, &datapath.Plan{Full: true, Frontends: []datapath.Frontend{tcp("a"), udp("c")}})

	// An established connection to a.
	conn := dial(t, w.client, vip)
	rd := bufio.NewReader(conn)
	say := func(msg string) (string, error) {
		conn.SetDeadline(time.Now().Add(timeout))
		if _, err := fmt.Fprintf(conn, "%s\n", msg); err != nil {
			return "", err
		}
		return rd.ReadString('\n')
	}
	if got, err := say("one"); err != nil || got != "a one\n" {
		t.Fatalf("before: %q %v", got, err)
	}
	// UDP from a fixed source port reaches c.
	if r, err := w.client.UDP(ap("10.96.2.1", 53), 40000, timeout); err != nil || r.Name != "c" {
		t.Fatalf("UDP before: %v %v", r, err)
	}

	// a leaves the plan for b; c leaves for d.
	w.apply(w.p, &datapath.Plan{Changed: map[datapath.ServicePortName]bool{{Namespace: "default", Name: "hold", Port: "tcp"}: true, {Namespace: "default", Name: "dns", Port: "udp"}: true},
		Frontends: []datapath.Frontend{tcp("b"), udp("d")}})
	k := w.kernel()
	hold := k[Key{vip.Addr(), datapath.TCP, 80}].Reals
	if len(hold) != 2 || hold[0].Addr != w.pods["a"].AddrPort(9090) || hold[0].Weight != 0 || hold[1].Weight != 1 {
		t.Fatalf("after removal: real servers %v, want a at weight 0 and b at 1", hold)
	}
	if w.p.Draining() != 1 {
		t.Errorf("draining = %d, want 1", w.p.Draining())
	}
	if got, err := say("two"); err != nil || got != "a two\n" {
		t.Errorf("the established connection broke when its endpoint left: %q %v", got, err)
	}
	if got, err := talk(w.client, vip, "new"); err != nil || got != "b new\n" {
		t.Errorf("a new connection after the removal: %q %v, want b", got, err)
	}
	if reals := k[Key{vip.Addr(), datapath.UDP, 53}].Reals; len(reals) != 1 || reals[0].Addr != w.pods["d"].AddrPort(8080) {
		t.Errorf("UDP real servers after removal %v, want only d (no draining for UDP)", reals)
	}

	// The UDP client keeps its source port and lands on the new pod.
	if r, err := w.client.UDP(ap("10.96.2.1", 53), 40000, timeout); err != nil || r.Name != "d" {
		t.Errorf("UDP after its endpoint moved, same source port: %v %v, want d", r, err)
	}

	// While the connection lives and the grace period runs, a stays.
	w.clock.Step(5 * time.Second)
	w.apply(w.p, &datapath.Plan{Frontends: []datapath.Frontend{tcp("b"), udp("d")}})
	if n := len(w.kernel()[Key{vip.Addr(), datapath.TCP, 80}].Reals); n != 2 {
		t.Errorf("within the grace period: %d real servers, want 2", n)
	}
	// After the grace period it goes, even with connections.
	w.clock.Step(6 * time.Second)
	w.apply(w.p, &datapath.Plan{Frontends: []datapath.Frontend{tcp("b"), udp("d")}})
	if reals := w.kernel()[Key{vip.Addr(), datapath.TCP, 80}].Reals; len(reals) != 1 || reals[0].Addr != w.pods["b"].AddrPort(9090) {
		t.Errorf("after the grace period: %v, want only b", reals)
	}
	if w.p.Draining() != 0 {
		t.Errorf("draining = %d, want 0", w.p.Draining())
	}

	// A restarted proxier finds a real server left at weight 0 and, the
	// endpoint being back in the plan, gives its weight back.
	err := w.node.Do(func() error {
		k, err := Open()
		if err != nil {
			return err
		}
		defer k.Close()
		v := VirtualServer{Addr: vip.Addr(), Protocol: datapath.TCP, Port: 80}
		return k.UpdateRealServer(v, RealServer{Addr: w.pods["b"].AddrPort(9090), Weight: 0})
	})
	if err != nil {
		t.Fatal(err)
	}
	p2 := w.newProxier(Options{ClusterCIDRs: []netip.Prefix{w.node.PodNet}})
	w.apply(p2, &datapath.Plan{Full: true, Frontends: []datapath.Frontend{tcp("b"), udp("d")}})
	if reals := w.kernel()[Key{vip.Addr(), datapath.TCP, 80}].Reals; len(reals) != 1 || reals[0].Weight != 1 {
		t.Errorf("after restart: %v, want b back at weight 1", reals)
	}
}

// chunkServer serves, on port, one chunk of size bytes (the pod's name,
// then filler) for every byte a client sends, until the client closes.
func chunkServer(t *testing.T, pod *netns.Pod, port uint16, size int) {
	t.Helper()
	chunk := []byte(strings.Repeat(".", size))
	copy(chunk, pod.PodName)
	serveConns(t, listenTCP(t, pod.NS, port), func(c net.Conn) {
		one := make([]byte, 1)
		for {
			c.SetDeadline(time.Now().Add(time.Minute))
			if _, err := c.Read(one); err != nil {
				return
			}
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	})
}

// listenTCP listens on port (IPv4, every address) in ns.
func listenTCP(t *testing.T, ns *netns.NS, port uint16) net.Listener {
	t.Helper()
	var l net.Listener
	if err := ns.Do(func() error {
		var err error
		l, err = net.Listen("tcp4", fmt.Sprintf(":%d", port))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return l
}

// serveConns runs handle on every connection l accepts, each in its own
// goroutine, and closes the connection after it; the test's cleanup
// closes l and waits for them all.
func serveConns(t *testing.T, l net.Listener, handle func(net.Conn)) {
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				handle(c)
			}()
		}
	}()
}

// TestGracefulTerminationLongDownload: a download through an endpoint that
// leaves the plan runs to its end (the real server drains at weight 0); a
// removed real server without connections goes at once; one whose
// connections outlive the grace period goes when it is over; a removed
// UDP real server goes at once.
func TestGracefulTerminationLongDownload(t *testing.T) {
	w := newWorld(t, "a", "b", "c", "d")
	const chunk, chunks = 64 << 10, 64 // 4 MiB
	for _, p := range []string{"a", "b"} {
		chunkServer(t, w.pods[p], 9191, chunk)
	}
	vip := ap("10.96.2.2", 80)
	tcp, udp := w.drainPair(datapath.ServicePortName{Namespace: "default", Name: "dl", Port: "tcp"}, vip.Addr(), 9191)
	changed := map[datapath.ServicePortName]bool{{Namespace: "default", Name: "dl", Port: "tcp"}: true, {Namespace: "default", Name: "dns", Port: "udp"}: true}
	tcpKey, udpKey := Key{vip.Addr(), datapath.TCP, 80}, Key{vip.Addr(), datapath.UDP, 53}
	w.apply(w.p, &datapath.Plan{Full: true, Frontends: []datapath.Frontend{tcp("a"), udp("c", "d")}})

	conn := dial(t, w.client, vip)
	buf := make([]byte, chunk)
	next := func() error {
		conn.SetDeadline(time.Now().Add(timeout))
		if _, err := conn.Write([]byte{1}); err != nil {
			return err
		}
		_, err := io.ReadFull(conn, buf)
		return err
	}
	if err := next(); err != nil || !strings.HasPrefix(string(buf), "a") {
		t.Fatalf("first chunk: %v (from %q)", err, buf[:2])
	}

	// a leaves the plan for b mid-download; UDP loses c.
	w.apply(w.p, &datapath.Plan{Changed: changed, Frontends: []datapath.Frontend{tcp("b"), udp("d")}})
	reals := w.kernel()[tcpKey].Reals
	if len(reals) != 2 || reals[0].Addr != w.pods["a"].AddrPort(9191) || reals[0].Weight != 0 || reals[0].Active != 1 {
		t.Fatalf("after a left: %v (active %d), want a at weight 0 with its connection, and b", reals, reals[0].Active)
	}
	if got := w.kernel()[udpKey].Reals; len(got) != 1 || got[0].Addr != w.pods["d"].AddrPort(8080) {
		t.Errorf("UDP real servers after c left: %v, want d alone at once", got)
	}
	// b leaves before any connection reached it: deleted at once, while
	// a still drains.
	w.apply(w.p, &datapath.Plan{Changed: changed, Frontends: []datapath.Frontend{tcp(), udp("d")}})
	reals = w.kernel()[tcpKey].Reals
	if len(reals) != 1 || reals[0].Addr != w.pods["a"].AddrPort(9191) {
		t.Errorf("after b left unused: %v, want a alone (draining)", reals)
	}
	w.apply(w.p, &datapath.Plan{Changed: changed, Frontends: []datapath.Frontend{tcp("b"), udp("d")}})

	// The download runs to its end through the removed endpoint, with
	// syncs (partial, unchanged) in between that must not cut it.
	total := chunk
	for i := 1; i < chunks; i++ {
		if i%16 == 0 {
			w.clock.Step(time.Second)
			w.apply(w.p, &datapath.Plan{Frontends: []datapath.Frontend{tcp("b"), udp("d")}})
		}
		if err := next(); err != nil {
			t.Fatalf("the download broke after %d bytes: %v", total, err)
		}
		if !strings.HasPrefix(string(buf), "a") {
			t.Fatalf("chunk %d came from %q, want a", i, buf[:2])
		}
		total += len(buf)
	}
	if total != chunk*chunks {
		t.Fatalf("downloaded %d bytes, want %d", total, chunk*chunks)
	}
	conn.Close()

	// Closed, the connection lingers in IPVS as inactive (FIN_WAIT):
	// within the grace period a stays.
	w.apply(w.p, &datapath.Plan{Frontends: []datapath.Frontend{tcp("b"), udp("d")}})
	reals = w.kernel()[tcpKey].Reals
	if len(reals) != 2 || reals[0].Active+reals[0].Inactive == 0 {
		t.Fatalf("closed, within the grace period: %v, want a still there with an inactive connection", reals)
	}
	// After the grace period a goes, even with that connection.
	w.clock.Step(10 * time.Second)
	w.apply(w.p, &datapath.Plan{Frontends: []datapath.Frontend{tcp("b"), udp("d")}})
	if reals := w.kernel()[tcpKey].Reals; len(reals) != 1 || reals[0].Addr != w.pods["b"].AddrPort(9191) {
		t.Errorf("after the grace period: %v, want b alone", reals)
	}
	if w.p.Draining() != 0 {
		t.Errorf("draining = %d, want 0", w.p.Draining())
	}
}

func manyServices(n int, ep datapath.Endpoint) *datapath.Plan {
	p := &datapath.Plan{Full: true}
	for i := range n {
		a := netip.AddrFrom4([4]byte{10, 97, byte(i >> 8), byte(i)})
		p.Frontends = append(p.Frontends, datapath.Frontend{
			Service: datapath.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("svc-%04d", i), Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP,
			Addr: a, Family: datapath.IPv4, Port: 80, Endpoints: []datapath.Endpoint{ep},
		})
	}
	return p
}

func TestRuleCountConstantAndRestartWithoutDisruption(t *testing.T) {
	w := newWorld(t, "a")
	count := func() int {
		var n int
		if err := w.node.Do(func() error {
			var err error
			n, err = w.p.ipt[0].countRules(context.Background())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	w.apply(w.p, manyServices(10, w.ep("a", 1)))
	at10 := count()
	start := time.Now()
	w.apply(w.p, manyServices(1000, w.ep("a", 1)))
	st := w.p.LastStats()
	t.Logf("1000 services: full apply %s (wall %s), %d netlink operations", st.Duration, time.Since(start), st.Ops())
	at1000 := count()
	if at10 != at1000 || at10 == 0 {
		t.Errorf("iptables rules: %d with 10 services, %d with 1000; want equal and non-zero", at10, at1000)
	}
	if n := len(w.kernel()); n != 1000 {
		t.Errorf("kernel holds %d virtual servers, want 1000", n)
	}
	var entries int
	w.node.Do(func() error {
		_, es, _, err := ipset.Netlink{}.Get(setClusterIP)
		entries = len(es)
		return err
	})
	if entries != 1000 {
		t.Errorf("%s holds %d entries, want 1000", setClusterIP, entries)
	}
	if r, err := w.client.TCP(ap("10.97.3.231", 80), timeout); err != nil || r.Name != "a" {
		t.Fatalf("service 999: %v %v", r, err)
	}

	// A restarted agent (new Proxier, nothing in memory) applying the same
	// plan changes nothing in the kernel, and traffic flows throughout.
	p2 := w.newProxier(Options{ClusterCIDRs: []netip.Prefix{w.node.PodNet}})
	w.apply(p2, manyServices(1000, w.ep("a", 1)))
	if st := p2.LastStats(); st.Ops()-st.Reads != 0 {
		t.Errorf("restart applied %d changes to an up-to-date kernel: %+v", st.Ops()-st.Reads, st)
	}
	if r, err := w.client.TCP(ap("10.97.0.5", 80), timeout); err != nil || r.Name != "a" {
		t.Errorf("after restart: %v %v", r, err)
	}
	// A partial sync of one changed service touches only it.
	plan := manyServices(1000, w.ep("a", 1))
	plan.Full = false
	plan.Changed = map[datapath.ServicePortName]bool{{Namespace: "ns", Name: "svc-0007", Port: "http"}: true}
	plan.Frontends[7].Endpoints[0].Weight = 5
	w.apply(p2, plan)
	if st := p2.LastStats(); st.RealServers.Updated != 1 || st.Ops()-st.Reads != 1 {
		t.Errorf("one-endpoint change: %+v, want exactly one real-server update", st)
	}

	// Tampering is seen, and a full apply repairs it; Cleanup removes
	// everything.
	tampered := func() bool {
		var yes bool
		if err := w.node.Do(func() error { var err error; yes, err = p2.Tampered(context.Background()); return err }); err != nil {
			t.Fatal(err)
		}
		return yes
	}
	if tampered() {
		t.Error("an untouched kernel was reported as tampered with")
	}
	for what, cmd := range map[string][]string{
		"a flushed chain":          {"iptables", "-t", "nat", "-F", chainServices},
		"a removed VIP":            {"ip", "addr", "del", "10.97.0.9/32", "dev", "edgeproxy0"},
		"a deleted virtual server": {"ipvsadm", "-D", "-t", "10.97.0.9:80"},
	} {
		if _, err := exec.LookPath(cmd[0]); err != nil {
			continue
		}
		if out, err := w.node.Run(cmd[0], cmd[1:]...); err != nil {
			t.Fatalf("%s: %v %s", what, err, out)
		}
		if !tampered() {
			t.Errorf("%s was not reported as tampering", what)
		}
		w.apply(p2, manyServices(1000, w.ep("a", 1)))
		if tampered() {
			t.Errorf("a full apply did not repair %s", what)
		}
	}
	// A set emptied by hand (here: an entry deleted, as `ipset del` would)
	// is tampering too; the full apply puts the entry back.
	setEdit := func(op func(ipset.Set, ipset.Entry) error) {
		t.Helper()
		s := ipset.Set{Name: setClusterIP, Type: ipset.HashIPPort, Family: datapath.IPv4}
		if err := w.node.Do(func() error {
			return op(s, ipset.Entry{Addr: addr("10.97.0.9"), Protocol: datapath.TCP, Port: 80})
		}); err != nil {
			t.Fatal(err)
		}
	}
	setEdit(ipset.Netlink{}.Del)
	if !tampered() {
		t.Error("an entry deleted from a set was not reported as tampering")
	}
	w.apply(p2, manyServices(1000, w.ep("a", 1)))
	if tampered() {
		t.Error("a full apply did not put the deleted set entry back")
	}
	if err := w.node.Do(func() error { return p2.Cleanup(context.Background()) }); err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	if n := count(); n != 0 {
		t.Errorf("%d rules left after cleanup", n)
	}
	if n := len(w.kernel()); n != 0 {
		t.Errorf("%d virtual servers left after cleanup", n)
	}
	w.node.Do(func() error {
		names, _ := ipset.Netlink{}.Names()
		if len(names) != 0 {
			t.Errorf("sets left after cleanup: %v", names)
		}
		if addrs, _ := w.p.link.addresses(); len(addrs) != 0 {
			t.Errorf("dummy link still holds %v", addrs)
		}
		return nil
	})
}

func TestExternalTrafficPolicyHairpinAndSourceRanges(t *testing.T) {
	w := newWorld(t, "a", "b")
	clientIP := addr("192.168.77.2")
	fe := func(svc datapath.ServicePortName, kind datapath.Kind, a string, port uint16, local bool, eps ...string) datapath.Frontend {
		f := datapath.Frontend{Service: svc, Kind: kind, Protocol: datapath.TCP, Family: datapath.IPv4, Port: port, LocalOnly: local}
		if a != "" {
			f.Addr = addr(a)
		}
		for _, e := range eps {
			f.Endpoints = append(f.Endpoints, w.ep(e, 1))
		}
		return f
	}
	denied := fe(datapath.ServicePortName{Namespace: "default", Name: "lb-deny", Port: "http"}, datapath.LoadBalancer, "203.0.113.30", 80, false, "a")
	denied.SourceRanges = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	allowed := fe(datapath.ServicePortName{Namespace: "default", Name: "lb-allow", Port: "http"}, datapath.LoadBalancer, "203.0.113.31", 80, false, "a")
	allowed.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.168.77.0/24")}
	// Policy Local, and the service's endpoints are all elsewhere (Drop):
	// outside clients are dropped.
	empty := fe(datapath.ServicePortName{Namespace: "default", Name: "lb-local-empty", Port: "http"}, datapath.LoadBalancer, "203.0.113.40", 80, true)
	empty.Drop = true
	w.apply(w.p, &datapath.Plan{Full: true, Frontends: []datapath.Frontend{
		fe(datapath.ServicePortName{Namespace: "default", Name: "ext", Port: "http"}, datapath.ExternalIP, "203.0.113.10", 80, false, "a"),
		fe(datapath.ServicePortName{Namespace: "default", Name: "lb-local", Port: "http"}, datapath.LoadBalancer, "203.0.113.20", 80, true, "b"),
		fe(datapath.ServicePortName{Namespace: "default", Name: "np-local", Port: "http"}, datapath.NodePort, "", 30090, true, "b"),
		empty,
		fe(datapath.ServicePortName{Namespace: "default", Name: "self", Port: "http"}, datapath.ClusterIP, "10.96.3.1", 80, false, "a"),
		denied, allowed,
	}})
	cases := []struct {
		name     string
		from     *netns.NS
		dst      netip.AddrPort
		want     string // pod name, or "" for no answer
		keepsSrc bool   // the pod must see the client's own address
	}{
		{"ExternalIP, policy Cluster: masqueraded", w.client, ap("203.0.113.10", 80), "a", false},
		{"LoadBalancer, policy Local: source kept", w.client, ap("203.0.113.20", 80), "b", true},
		{"NodePort, policy Local: source kept", w.client, netip.AddrPortFrom(w.node.LinkIP, 30090), "b", true},
		{"LoadBalancer source range allows the client", w.client, ap("203.0.113.31", 80), "a", false},
		{"LoadBalancer source range denies the client", w.client, ap("203.0.113.30", 80), "", false},
		{"policy Local without local endpoints: dropped", w.client, ap("203.0.113.40", 80), "", false},
	}
	for _, c := range cases {
		r, err := c.from.TCP(c.dst, timeout)
		switch {
		case c.want == "":
			if err == nil {
				t.Errorf("%s: answered by %s, want no answer", c.name, r.Name)
			} else if strings.Contains(err.Error(), "refused") {
				t.Errorf("%s: refused; want the packets dropped", c.name)
			}
		case err != nil:
			t.Errorf("%s: %v", c.name, err)
		case r.Name != c.want:
			t.Errorf("%s: answered by %s, want %s", c.name, r.Name, c.want)
		case c.keepsSrc && r.Client.Addr() != clientIP:
			t.Errorf("%s: pod saw %s, want the client's %s", c.name, r.Client, clientIP)
		case !c.keepsSrc && r.Client.Addr() == clientIP:
			t.Errorf("%s: pod saw the client's own address %s; want it masqueraded", c.name, r.Client)
		}
	}
	// Hairpin: a reaches itself through the ClusterIP, masqueraded so the
	// reply goes back through the node.
	r, err := w.pods["a"].TCP(ap("10.96.3.1", 80), timeout)
	if err != nil || r.Name != "a" {
		t.Errorf("hairpin: %v %v", r, err)
	} else if r.Client.Addr() == w.pods["a"].IP {
		t.Errorf("hairpin: a saw its own address %s; want the node's", r.Client)
	}
}

// TestLocalPolicyFallback: an external frontend of policy Local on a node
// without local endpoints serves pods and the node itself from the
// cluster-wide endpoints (kube-proxy IPVS's fallback); outside clients
// are dropped. Without any endpoint it may use, a frontend refuses.
func TestLocalPolicyFallback(t *testing.T) {
	w := newWorld(t, "b", "c")
	cluster := []datapath.Endpoint{{Addr: w.pods["b"].AddrPort(8080), Weight: 1}} // elsewhere, as far as the plan says
	lb := datapath.Frontend{Service: datapath.ServicePortName{Namespace: "default", Name: "lb", Port: "http"}, Kind: datapath.LoadBalancer, Protocol: datapath.TCP, Family: datapath.IPv4,
		Addr: addr("203.0.113.50"), Port: 80, LocalOnly: true, Drop: true, Cluster: cluster}
	np := lb
	np.Kind, np.Addr, np.Port = datapath.NodePort, netip.Addr{}, 30091
	// Refused, as kube-proxy IPVS does: policy Local and no endpoint
	// anywhere; internal policy Local and none here.
	none := lb
	none.Service, none.Addr, none.Drop, none.Cluster = datapath.ServicePortName{Namespace: "default", Name: "none", Port: "http"}, addr("203.0.113.51"), false, nil
	itp := datapath.Frontend{Service: datapath.ServicePortName{Namespace: "default", Name: "itp", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Family: datapath.IPv4,
		Addr: addr("10.96.5.1"), Port: 80, Drop: true}
	w.apply(w.p, &datapath.Plan{Full: true, Frontends: []datapath.Frontend{lb, np, none, itp}})
	for _, dst := range []netip.AddrPort{ap("203.0.113.51", 80), ap("10.96.5.1", 80)} {
		if _, err := w.client.TCP(dst, timeout); err == nil || !strings.Contains(err.Error(), "refused") {
			t.Errorf("outside client -> %s (no endpoint it may use): %v, want refused", dst, err)
		}
	}
	lbAddr, npAddr := ap("203.0.113.50", 80), netip.AddrPortFrom(w.node.LinkIP, 30091)
	for _, c := range []struct {
		name string
		from *netns.NS
		dst  netip.AddrPort
		src  netip.Addr // the address the endpoint must see; invalid: any
	}{
		{"pod -> LoadBalancer", w.pods["c"].NS, lbAddr, w.pods["c"].IP},
		{"pod -> NodePort", w.pods["c"].NS, npAddr, w.pods["c"].IP},
		{"node -> LoadBalancer", w.node.NS, lbAddr, netip.Addr{}},
		{"node -> NodePort", w.node.NS, npAddr, netip.Addr{}},
	} {
		r, err := c.from.TCP(c.dst, timeout)
		switch {
		case err != nil:
			t.Errorf("%s: %v, want the cluster-wide endpoint b", c.name, err)
		case r.Name != "b":
			t.Errorf("%s: answered by %s, want b", c.name, r.Name)
		case c.src.IsValid() && r.Client.Addr() != c.src:
			t.Errorf("%s: b saw %s, want %s", c.name, r.Client, c.src)
		case !c.src.IsValid() && r.Client.Addr() == lbAddr.Addr():
			t.Errorf("%s: b saw the LoadBalancer address as source; want it masqueraded", c.name)
		}
	}
	for _, dst := range []netip.AddrPort{lbAddr, npAddr} {
		if r, err := w.client.TCP(dst, timeout); err == nil {
			t.Errorf("outside client -> %s: answered by %s, want it dropped (no local endpoint)", dst, r.Name)
		} else if strings.Contains(err.Error(), "refused") {
			t.Errorf("outside client -> %s: refused, want it dropped", dst)
		}
	}
}

// TestMasqueradeLikeUpstream: without cluster ranges only what the node
// sends from a service address is masqueraded (pods and outside clients
// keep their source, as with kube-proxy); a load balancer's source ranges
// let the node in when one of them holds a node address (allowFromNode),
// and keep it out otherwise.
func TestMasqueradeLikeUpstream(t *testing.T) {
	w := newWorld(t, "a", "c")
	p := w.newProxier(Options{}) // no clusterCIDR
	vip := ap("10.96.4.1", 80)
	fe := func(svc datapath.ServicePortName, kind datapath.Kind, a netip.Addr, ranges ...string) datapath.Frontend {
		f := datapath.Frontend{Service: svc, Kind: kind, Protocol: datapath.TCP, Family: datapath.IPv4, Addr: a, Port: 80,
			Endpoints: []datapath.Endpoint{w.ep("a", 1)}}
		for _, r := range ranges {
			f.SourceRanges = append(f.SourceRanges, netip.MustParsePrefix(r))
		}
		return f
	}
	w.apply(p, &datapath.Plan{Full: true, Frontends: []datapath.Frontend{
		fe(datapath.ServicePortName{Namespace: "default", Name: "web", Port: "http"}, datapath.ClusterIP, vip.Addr()),
		fe(datapath.ServicePortName{Namespace: "default", Name: "lb-node", Port: "http"}, datapath.LoadBalancer, addr("203.0.113.60"), "192.168.77.0/24"),
		fe(datapath.ServicePortName{Namespace: "default", Name: "lb-other", Port: "http"}, datapath.LoadBalancer, addr("203.0.113.61"), "198.51.100.0/24"),
	}})
	if r, err := w.pods["c"].TCP(vip, timeout); err != nil || r.Client.Addr() != w.pods["c"].IP {
		t.Errorf("pod -> ClusterIP without clusterCIDR: %v %v, want the pod's own source %s", r, err, w.pods["c"].IP)
	}
	if r, err := w.client.TCP(vip, timeout); err != nil || r.Client.Addr() != addr("192.168.77.2") {
		t.Errorf("outside client -> ClusterIP without clusterCIDR: %v %v, want its own source kept", r, err)
	}
	if r, err := w.node.TCP(vip, timeout); err != nil || r.Client.Addr() == vip.Addr() {
		t.Errorf("node -> ClusterIP: %v %v, want a masqueraded source (not the service address)", r, err)
	}
	if r, err := w.node.TCP(ap("203.0.113.60", 80), timeout); err != nil || r.Name != "a" {
		t.Errorf("node -> load balancer whose source ranges hold the node: %v %v, want a", r, err)
	}
	if r, err := w.client.TCP(ap("203.0.113.60", 80), timeout); err != nil || r.Name != "a" {
		t.Errorf("client inside the source range: %v %v, want a", r, err)
	}
	if r, err := w.node.TCP(ap("203.0.113.61", 80), timeout); err == nil {
		t.Errorf("node -> load balancer whose source ranges leave the node out: answered by %s, want it dropped", r.Name)
	}
}

// TestDetectLocalModes: kube-proxy's local-traffic detection modes with
// real IPVS traffic. A pod's packets come in on the node's bridge br0:
// told by the bridge (BridgeInterface), by a prefix of it
// (InterfaceNamePrefix) or by the Node's pod range from the plan
// (NodeCIDR), the pod keeps its source to a ClusterIP and the outside
// client is masqueraded; a prefix no pod's packets arrive on ("veth")
// tells no one, and the pod is masqueraded too.
func TestDetectLocalModes(t *testing.T) {
	w := newWorld(t, "a", "c")
	vip := ap("10.96.5.1", 80)
	plan := func() *datapath.Plan {
		return &datapath.Plan{Full: true, PodCIDRs: []netip.Prefix{w.node.PodNet}, Frontends: []datapath.Frontend{{
			Service: datapath.ServicePortName{Namespace: "default", Name: "web", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP,
			Family: datapath.IPv4, Addr: vip.Addr(), Port: 80, Endpoints: []datapath.Endpoint{w.ep("a", 1)}}}}
	}
	for _, c := range []struct {
		name    string
		opts    Options
		podMasq bool
	}{
		{"BridgeInterface", Options{PodInterface: "br0"}, false},
		{"InterfaceNamePrefix", Options{PodInterface: "br+"}, false},
		{"NodeCIDR", Options{NodePodCIDRs: true, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.99.0.0/16")}}, false},
		{"InterfaceNamePrefix naming no pod link", Options{PodInterface: "veth+"}, true},
	} {
		p := w.newProxier(c.opts)
		w.apply(p, plan())
		if r, err := w.pods["c"].TCP(vip, timeout); err != nil || r.Name != "a" {
			t.Errorf("%s: pod -> ClusterIP: %v %v", c.name, r, err)
		} else if masq := r.Client.Addr() != w.pods["c"].IP; masq != c.podMasq {
			t.Errorf("%s: pod -> ClusterIP: a saw %s (masqueraded %v), want masqueraded %v", c.name, r.Client, masq, c.podMasq)
		}
		if r, err := w.client.TCP(vip, timeout); err != nil || r.Name != "a" {
			t.Errorf("%s: client -> ClusterIP: %v %v", c.name, r, err)
		} else if r.Client.Addr() == addr("192.168.77.2") {
			t.Errorf("%s: client -> ClusterIP kept its source %s; want it masqueraded", c.name, r.Client)
		}
	}
}

// TestHostPortsOnServiceAddresses: a daemon of the node listening on
// 0.0.0.0 answers on the node's own addresses, but not through a service
// address (bound on the dummy link) on a port no service uses: refused,
// from outside and from a pod, as kube-proxy's KUBE-IPVS-FILTER does. The
// service port of the same address still works.
func TestHostPortsOnServiceAddresses(t *testing.T) {
	w := newWorld(t, "a", "c")
	serveConns(t, listenTCP(t, w.node.NS, 9999), func(c net.Conn) { fmt.Fprintf(c, "node %s\n", c.RemoteAddr()) })
	// A healthCheckNodePort answers on every address, service addresses
	// included, as kube-proxy's KUBE-IPVS-FILTER lets it.
	serveConns(t, listenTCP(t, w.node.NS, 31999), func(c net.Conn) { fmt.Fprintf(c, "node %s\n", c.RemoteAddr()) })
	w.apply(w.p, &datapath.Plan{Full: true, HealthCheckPorts: []uint16{31999}, Frontends: []datapath.Frontend{
		{Service: datapath.ServicePortName{Namespace: "default", Name: "web", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Family: datapath.IPv4, Addr: addr("10.96.5.1"), Port: 80,
			Endpoints: []datapath.Endpoint{w.ep("a", 1)}},
		{Service: datapath.ServicePortName{Namespace: "default", Name: "lb", Port: "http"}, Kind: datapath.LoadBalancer, Protocol: datapath.TCP, Family: datapath.IPv4, Addr: addr("203.0.113.70"), Port: 80,
			Endpoints: []datapath.Endpoint{w.ep("a", 1)}},
	}})
	if r, err := w.client.TCP(netip.AddrPortFrom(w.node.LinkIP, 9999), timeout); err != nil || r.Name != "node" {
		t.Fatalf("client -> node address, host port: %v %v, want the node's daemon", r, err)
	}
	for _, dst := range []netip.AddrPort{ap("10.96.5.1", 9999), ap("203.0.113.70", 9999)} {
		for _, from := range []*netns.NS{w.client, w.pods["c"].NS} {
			if r, err := from.TCP(dst, timeout); err == nil || !strings.Contains(err.Error(), "refused") {
				t.Errorf("%s -> %s (a host port on a service address): %v %v, want refused", from.Name, dst, r, err)
			}
		}
	}
	for _, dst := range []netip.AddrPort{ap("10.96.5.1", 80), ap("203.0.113.70", 80)} {
		if r, err := w.client.TCP(dst, timeout); err != nil || r.Name != "a" {
			t.Errorf("client -> %s (the service port): %v %v, want a", dst, r, err)
		}
	}
	if r, err := w.client.TCP(ap("203.0.113.70", 31999), timeout); err != nil || r.Name != "node" {
		t.Errorf("client -> LB address, healthCheckNodePort: %v %v, want the node's health check", r, err)
	}
}

func TestSysctlsAndTimeouts(t *testing.T) {
	w := newWorld(t)
	w.newProxier(Options{StrictARP: true, TCPTimeout: 900 * time.Second, TCPFinTimeout: 60 * time.Second, UDPTimeout: 120 * time.Second})
	for name, want := range map[string]string{
		"net/ipv4/vs/conntrack":                 "1",
		"net/ipv4/vs/expire_nodest_conn":        "1",
		"net/ipv4/vs/expire_quiescent_template": "1",
		"net/ipv4/ip_forward":                   "1",
		"net/ipv4/conf/all/arp_ignore":          "1",
		"net/ipv4/conf/all/arp_announce":        "2",
	} {
		var got string
		w.node.Do(func() error {
			b, err := os.ReadFile("/proc/sys/" + name)
			got = strings.TrimSpace(string(b))
			return err
		})
		if got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	if _, err := exec.LookPath("ipvsadm"); err == nil {
		out, err := w.node.Run("ipvsadm", "-L", "--timeout")
		if err != nil || !strings.Contains(out, "Timeout (tcp tcpfin udp): 900 60 120") {
			t.Errorf("IPVS timeouts: %q %v", out, err)
		}
	}
}

// TestReconfigureReachesTheKernel: settings changed while the proxier
// runs (a config reload) reach the kernel at the next Apply, even one
// whose plan changes nothing: the scheduler of a virtual server in place,
// masquerading of a pod's traffic (masqueradeAll, then a clusterCIDR
// without the pod), and back.
func TestReconfigureReachesTheKernel(t *testing.T) {
	w := newWorld(t, "a", "c")
	vip := ap("10.96.5.1", 80)
	plan := func(full bool) *datapath.Plan {
		return &datapath.Plan{Full: full, Changed: map[datapath.ServicePortName]bool{}, Frontends: []datapath.Frontend{{
			Service: datapath.ServicePortName{Namespace: "default", Name: "web", Port: "http"}, Kind: datapath.ClusterIP,
			Protocol: datapath.TCP, Family: datapath.IPv4, Addr: vip.Addr(), Port: 80, Endpoints: []datapath.Endpoint{w.ep("a", 1)}}}}
	}
	reconfigure := func(o Options) {
		t.Helper()
		if err := w.node.Do(func() error { return w.p.Reconfigure(o) }); err != nil {
			t.Fatal(err)
		}
	}
	seen := func(what string, want netip.Addr) {
		t.Helper()
		r, err := w.pods["c"].TCP(vip, timeout)
		if err != nil || r.Name != "a" || r.Client.Addr() != want {
			t.Fatalf("%s: %+v %v, want a seeing %s", what, r, err, want)
		}
	}
	key := Key{vip.Addr(), datapath.TCP, 80}
	w.apply(w.p, plan(true))
	seen("pod -> ClusterIP, pod in clusterCIDR", w.pods["c"].IP)
	if s := w.kernel()[key].VS.Scheduler; s != "rr" {
		t.Fatalf("scheduler %q, want rr", s)
	}

	reconfigure(Options{GracePeriod: 10 * time.Second, ClusterCIDRs: []netip.Prefix{w.node.PodNet}, MasqueradeAll: true, Scheduler: "lc"})
	w.apply(w.p, plan(false))
	if s := w.kernel()[key].VS.Scheduler; s != "lc" {
		t.Errorf("scheduler after the reload %q, want lc", s)
	}
	seen("pod -> ClusterIP with masqueradeAll", w.node.Gateway)

	reconfigure(Options{GracePeriod: 10 * time.Second, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.250.0.0/16")}})
	w.apply(w.p, plan(false))
	seen("pod -> ClusterIP, pod outside clusterCIDR", w.node.Gateway)

	reconfigure(Options{GracePeriod: 10 * time.Second, ClusterCIDRs: []netip.Prefix{w.node.PodNet}})
	w.apply(w.p, plan(false))
	seen("pod -> ClusterIP, pod in clusterCIDR again", w.pods["c"].IP)
	if s := w.kernel()[key].VS.Scheduler; s != "rr" {
		t.Errorf("scheduler after the second reload %q, want rr", s)
	}
}
