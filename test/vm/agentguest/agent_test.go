package agentguest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/ipset"
	"github.com/edgeproxy/edgeproxy/datapath/ipvs"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/internal/testkit/vm"
)

const (
	nodeName = "node1"
	podPort  = 8080
	dummy    = "edgeproxy0"
	timeout  = 3 * time.Second
)

var (
	webVIP    = netip.MustParseAddr("10.96.100.10") // canary/web: weighted module, NodePort 30080
	webVIP6   = netip.MustParseAddr("fd00:96::10")  // canary/web's IPv6 ClusterIP (dual-stack)
	stickyVIP = netip.MustParseAddr("10.96.100.30") // sched/sticky: scheduler module picks sh
	emptyVIP  = netip.MustParseAddr("10.96.100.40") // plain/empty: no endpoints
)

// repoFile is a path under the repository root; the test runs in its
// package directory, test/vm/agentguest.
func repoFile(t *testing.T, elem ...string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join(append([]string{"..", "..", ".."}, elem...)...))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		gate.Skip(t, fmt.Sprintf("needs %s (make build; modules/build.sh bin/modules)", p))
	}
	return p
}

type world struct {
	t              *testing.T
	node           *netns.Node
	client         *netns.NS
	a, b, c        *netns.Pod
	bin, dir       string
	weighted, schd string
	logPath        string
	before         kernel // IPVS mode's objects once programmed
}

// newWorld: a node namespace with pods a and b serving TCP and UDP echo on
// 8080, pod c (a client inside the cluster), an outside client, and the
// manifest directory.
func newWorld(t *testing.T) *world {
	t.Helper()
	vm.Guest(t)
	gate.Root(t)
	gate.Binaries(t, "iptables", "iptables-restore", "iptables-save")
	w := &world{t: t, bin: repoFile(t, "bin", "edgeproxy"),
		weighted: repoFile(t, "bin", "modules", "weighted.wasm"),
		schd:     repoFile(t, "bin", "modules", "scheduler.wasm"),
		dir:      t.TempDir()}
	w.node = netns.NewNode(t, "node")
	w.a, w.b, w.c = w.node.AddPod("a"), w.node.AddPod("b"), w.node.AddPod("c")
	w.client = w.node.AddClient("client")
	for _, p := range []*netns.Pod{w.a, w.b} {
		if err := p.Serve(podPort); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(w.dir, "manifests"), 0o755); err != nil {
		t.Fatal(err)
	}
	w.write(t, "manifests/objects.yaml", w.manifests())
	w.logPath = filepath.Join(w.dir, "agent.log")
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := os.ReadFile(w.logPath)
			t.Logf("agent log:\n%s", out)
			if out, err := w.node.Run("iptables-save"); err == nil {
				t.Logf("iptables-save in the node:\n%s", out)
			}
			w.ipvsadm(t)
		}
	})
	return w
}

// write replaces a file under the world's directory atomically.
func (w *world) write(t testing.TB, name, content string) {
	t.Helper()
	path := filepath.Join(w.dir, name)
	if err := os.WriteFile(path+".tmp", []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

func (w *world) manifests() string {
	return fmt.Sprintf(`apiVersion: v1
kind: Node
metadata:
  name: %[1]s
status:
  addresses: [{type: InternalIP, address: 192.168.77.1}]
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: canary
  annotations: {edgeproxy.io/weights: "addr:%[2]s=3,default=1"}
spec:
  type: NodePort
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: %[4]s
  clusterIPs: [%[4]s, %[7]s]
  ports:
    - {name: tcp, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30080}
    - {name: udp, port: 80, protocol: UDP, targetPort: 8080, nodePort: 30080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: canary
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports:
  - {name: tcp, port: 8080, protocol: TCP}
  - {name: udp, port: 8080, protocol: UDP}
endpoints:
  - {addresses: [%[2]s], nodeName: %[1]s, conditions: {ready: true}}
  - {addresses: [%[3]s], nodeName: %[1]s, conditions: {ready: true}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-2
  namespace: canary
  labels: {kubernetes.io/service-name: web}
addressType: IPv6
ports:
  - {name: tcp, port: 8080, protocol: TCP}
  - {name: udp, port: 8080, protocol: UDP}
endpoints:
  - {addresses: ["%[8]s"], nodeName: %[1]s, conditions: {ready: true}}
  - {addresses: ["%[9]s"], nodeName: %[1]s, conditions: {ready: true}}
---
apiVersion: v1
kind: Service
metadata:
  name: sticky
  namespace: sched
  annotations: {edgeproxy.io/scheduler: sh}
spec:
  clusterIP: %[5]s
  clusterIPs: [%[5]s]
  ports:
    - {name: tcp, port: 80, protocol: TCP, targetPort: 8080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: sticky-1
  namespace: sched
  labels: {kubernetes.io/service-name: sticky}
addressType: IPv4
ports:
  - {name: tcp, port: 8080, protocol: TCP}
endpoints:
  - {addresses: [%[2]s], nodeName: %[1]s, conditions: {ready: true}}
  - {addresses: [%[3]s], nodeName: %[1]s, conditions: {ready: true}}
---
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: plain}
spec:
  clusterIP: %[6]s
  clusterIPs: [%[6]s]
  ports:
    - {name: tcp, port: 80, protocol: TCP, targetPort: 8080}
`, nodeName, w.a.IP, w.b.IP, webVIP, stickyVIP, emptyVIP, webVIP6, w.a.IP6, w.b.IP6)
}

// config is the agent's configuration in mode: a manifest directory, the
// weighted module on namespace canary and the scheduler module on sched,
// with the interpreter engine (the VM emulates the CPU: slow).
func (w *world) config(t testing.TB, mode string) string {
	w.write(t, "config.yaml", fmt.Sprintf(`nodeName: %s
manifests: %s
mode: %s
clusterCIDR: 10.244.0.0/16,fd00:244::/64
stateDir: %s
sync: {minPeriod: 200ms, period: 30s}
policy:
  engine: interpreter
  timeout: 500ms
  modules:
    - {name: weighted, path: %s}
    - {name: scheduler, path: %s}
  chains:
    - name: canary
      match: {namespaces: [canary]}
      modules: [{module: weighted}]
    - name: sched
      match: {namespaces: [sched]}
      modules: [{module: scheduler}]
`, nodeName, filepath.Join(w.dir, "manifests"), mode, filepath.Join(w.dir, "state"), w.weighted, w.schd))
	return filepath.Join(w.dir, "config.yaml")
}

// start runs bin/edgeproxy in the node namespace in mode and waits until
// it reports healthy (its first sync is in the kernel).
func (w *world) start(t testing.TB, mode string) *exec.Cmd {
	t.Helper()
	cfg := w.config(t, mode)
	f, err := os.OpenFile(w.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	w.t.Cleanup(func() { f.Close() })
	fmt.Fprintf(f, "===== start mode %s\n", mode)
	from, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(w.bin, "run", "--config", cfg)
	cmd.Env = agentEnv()
	cmd.Stdout, cmd.Stderr = f, f
	if err := w.node.Start(w.t, cmd); err != nil {
		t.Fatal(err)
	}
	// An agent that does not come up is not left running (a t.Fatal in
	// a subtest must not leave it to fight the steps after).
	up := false
	defer func() {
		if !up {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	// /healthz answers 200 before the first sync (kube-proxy's meaning:
	// no update waits too long), so the log says when the kernel holds
	// the first plan. Under TCG on a busy host a start (two interpreted
	// module checks, iptables and ip6tables probes) has taken over two
	// minutes; the bound is generous.
	w.waitFor(t, 4*time.Minute, "agent in mode "+mode+": first sync done and healthy", func() error {
		b, err := os.ReadFile(w.logPath)
		if err != nil {
			return err
		}
		if !strings.Contains(string(b[min(from, int64(len(b))):]), "first sync done") {
			return errors.New("no \"first sync done\" in its log yet")
		}
		return w.healthz()
	})
	up = true
	return cmd
}

// agentEnv is the environment without the VM's marker, which the agent
// would otherwise read as a (misspelt) EDGEPROXY_* config key.
func agentEnv() []string {
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, vm.GuestEnv+"=") {
			env = append(env, e)
		}
	}
	return env
}

// stop signals the agent (its PID) and waits for it to end.
func (w *world) stop(t testing.TB, cmd *exec.Cmd, sig syscall.Signal) {
	t.Helper()
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("agent did not end within 30s of %v", sig)
	}
}

func (w *world) healthz() error {
	var conn net.Conn
	if err := w.node.Do(func() (err error) {
		conn, err = net.DialTimeout("tcp", "127.0.0.1:10256", time.Second)
		return err
	}); err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write([]byte("GET /healthz HTTP/1.0\r\n\r\n")); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthz: %s", resp.Status)
	}
	return nil
}

// waitFor polls fn every 200ms until it returns nil, for at most d.
func (w *world) waitFor(t testing.TB, d time.Duration, what string, fn func() error) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if err = fn(); err == nil {
			return
		}
	}
	t.Fatalf("%s: not within %s: %v", what, d, err)
}

// vs is one virtual server as the kernel holds it, without counters.
type vs struct {
	Scheduler string
	Flags     ipvs.Flags
	Reals     map[netip.AddrPort]int // weight
}

func (v vs) String() string {
	keys := slices.SortedFunc(maps.Keys(v.Reals), netip.AddrPort.Compare)
	var b strings.Builder
	fmt.Fprintf(&b, "%s flags=%#x", v.Scheduler, uint32(v.Flags))
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%d", k, v.Reals[k])
	}
	return b.String()
}

// kernel is what the node holds of IPVS mode: virtual servers, the dummy
// link's addresses (nil when the link does not exist) and the EP- ipsets.
type kernel struct {
	Servers map[ipvs.Key]vs
	Link    []netip.Addr
	HasLink bool
	Sets    []string
}

func (w *world) kernel(t testing.TB) kernel {
	t.Helper()
	k := kernel{Servers: map[ipvs.Key]vs{}}
	err := w.node.Do(func() error {
		h, err := ipvs.Open()
		if err != nil {
			return err
		}
		defer h.Close()
		vss, err := h.VirtualServers()
		if err != nil {
			return err
		}
		for _, v := range vss {
			rs, err := h.RealServers(v)
			if err != nil {
				return err
			}
			s := vs{Scheduler: v.Scheduler, Flags: v.Flags, Reals: map[netip.AddrPort]int{}}
			for _, r := range rs {
				s.Reals[r.Addr] = r.Weight
			}
			k.Servers[v.Key()] = s
		}
		names, err := ipset.Netlink{}.Names()
		if err != nil {
			return err
		}
		for _, n := range names {
			if strings.HasPrefix(n, "EP-") {
				k.Sets = append(k.Sets, n)
			}
		}
		slices.Sort(k.Sets)
		return nil
	})
	if err != nil {
		t.Fatalf("reading the node's kernel state: %v", err)
	}
	l, err := w.node.Netlink().LinkByName(dummy)
	var nf netlink.LinkNotFoundError
	switch {
	case errors.As(err, &nf):
	case err != nil:
		t.Fatalf("link %s: %v", dummy, err)
	default:
		k.HasLink = true
		addrs, err := w.node.Netlink().AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			if ip, _ := netip.AddrFromSlice(a.IP); !ip.IsLinkLocalUnicast() {
				k.Link = append(k.Link, ip.Unmap())
			}
		}
		slices.SortFunc(k.Link, netip.Addr.Compare)
	}
	return k
}

// ipvsadm logs `ipvsadm -Ln` from the node and returns it ("" without
// ipvsadm).
func (w *world) ipvsadm(t testing.TB) string {
	if _, err := exec.LookPath("ipvsadm"); err != nil {
		return ""
	}
	out, err := w.node.Run("ipvsadm", "-Ln")
	if err != nil {
		t.Errorf("ipvsadm -Ln: %v", err)
	}
	t.Logf("ipvsadm -Ln in the node:\n%s", out)
	return out
}

func key(a netip.Addr, p datapath.Protocol, port uint16) ipvs.Key {
	return ipvs.Key{Addr: a, Protocol: p, Port: port}
}

func (w *world) pod(r netns.Reply) bool { return r.Name == "a" || r.Name == "b" }

// TestIPVSAgent runs bin/edgeproxy with mode ipvs on a manifest directory
// and proves, with real traffic: services answered, policy-module weights
// and scheduler in the kernel and in the traffic split, a SIGKILL and
// restart without a failed connection or a flushed object, and a switch to
// iptables mode.
// serves checks canary/web in one family: its ClusterIP vip from outside
// (waiting for the agent's first sync) and from pod c, which must be seen
// as podSrc (in clusterCIDR, not masqueraded), over TCP and UDP, and its
// NodePort np from outside.
func (w *world) serves(t *testing.T, vip, np netip.AddrPort, podSrc netip.Addr) {
	t.Helper()
	w.waitFor(t, 30*time.Second, fmt.Sprintf("client -> ClusterIP %s tcp", vip), func() error {
		r, err := w.client.TCP(vip, timeout)
		if err == nil && !w.pod(r) {
			err = fmt.Errorf("answered by %+v", r)
		}
		return err
	})
	for proto, dial := range map[string]func(netip.AddrPort) (netns.Reply, error){
		"tcp": func(d netip.AddrPort) (netns.Reply, error) { return w.c.TCP(d, timeout) },
		"udp": func(d netip.AddrPort) (netns.Reply, error) { return w.c.UDP(d, 0, timeout) },
	} {
		if r, err := dial(vip); err != nil || !w.pod(r) || r.Client.Addr() != podSrc {
			t.Errorf("pod c -> ClusterIP %s %s: %+v %v; want a or b seeing %s", vip, proto, r, err, podSrc)
		}
	}
	if r, err := w.client.UDP(vip, 0, timeout); err != nil || !w.pod(r) {
		t.Errorf("client -> ClusterIP %s udp: %+v %v", vip, r, err)
	}
	if r, err := w.client.TCP(np, timeout); err != nil || !w.pod(r) {
		t.Errorf("client -> NodePort %s tcp: %+v %v", np, r, err)
	}
	if r, err := w.client.UDP(np, 0, timeout); err != nil || !w.pod(r) {
		t.Errorf("client -> NodePort %s udp: %+v %v", np, r, err)
	}
}

func TestIPVSAgent(t *testing.T) {
	w := newWorld(t)
	ag := w.start(t, "ipvs")
	webTCP := netip.AddrPortFrom(webVIP, 80)

	t.Run("traffic", func(t *testing.T) {
		w.serves(t, webTCP, netip.AddrPortFrom(w.node.LinkIP, 30080), w.c.IP)
		// No endpoints: refused (a REJECT, not a timeout).
		for _, from := range []*netns.NS{w.client, w.c.NS} {
			_, err := from.TCP(netip.AddrPortFrom(emptyVIP, 80), timeout)
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("%s -> service without endpoints: %v, want connection refused", from.Name, err)
			}
		}
	})

	// The node has IPv6 addresses: IPv6 Services are proxied too.
	t.Run("ipv6", func(t *testing.T) {
		w.serves(t, netip.AddrPortFrom(webVIP6, 80), netip.AddrPortFrom(w.node.LinkIP6, 30080), w.c.IP6)
		k := w.kernel(t)
		want := map[netip.AddrPort]int{w.a.AddrPort6(podPort): 1, w.b.AddrPort6(podPort): 1}
		for _, fk := range []ipvs.Key{key(webVIP6, datapath.TCP, 80), key(webVIP6, datapath.UDP, 80), key(w.node.LinkIP6, datapath.TCP, 30080)} {
			if v, ok := k.Servers[fk]; !ok || !maps.Equal(v.Reals, want) {
				t.Errorf("%s: kernel has %v (present %v); want a and b's IPv6 addresses", fk, v, ok)
			}
		}
		if !slices.Contains(k.Link, webVIP6) {
			t.Errorf("dummy link addresses %v lack %s", k.Link, webVIP6)
		}
	})

	// The same as ipvsadm lists it, and counted per real server.
	t.Run("ipv6-ipvsadm", w.ipvsadmIPv6)

	t.Run("policy", func(t *testing.T) {
		k := w.kernel(t)
		for _, p := range []datapath.Protocol{datapath.TCP, datapath.UDP} {
			for _, fk := range []ipvs.Key{key(webVIP, p, 80), key(w.node.LinkIP, p, 30080)} {
				v, ok := k.Servers[fk]
				want := map[netip.AddrPort]int{w.a.AddrPort(podPort): 3, w.b.AddrPort(podPort): 1}
				if !ok || v.Scheduler != "wrr" || !maps.Equal(v.Reals, want) {
					t.Errorf("%s: kernel has %v (present %v); want wrr with a=3 b=1 from the weighted module", fk, v, ok)
				}
			}
		}
		if v := k.Servers[key(stickyVIP, datapath.TCP, 80)]; v.Scheduler != "sh" {
			t.Errorf("sched/sticky: kernel scheduler %q, want sh from the scheduler module", v.Scheduler)
		}
		if out := w.ipvsadm(t); out != "" {
			for _, re := range []string{
				`TCP\s+10\.96\.100\.10:80 wrr\s*\n(\s+->.*\n)*\s+-> ` + regexp.QuoteMeta(w.a.AddrPort(podPort).String()) + `\s+Masq\s+3\s`,
				`TCP\s+10\.96\.100\.10:80 wrr\s*\n(\s+->.*\n)*\s+-> ` + regexp.QuoteMeta(w.b.AddrPort(podPort).String()) + `\s+Masq\s+1\s`,
				`TCP\s+10\.96\.100\.30:80 sh\b`,
			} {
				if !regexp.MustCompile(re).MatchString(out) {
					t.Errorf("ipvsadm -Ln does not match %s", re)
				}
			}
		}

		// The split over new connections: 3:1 within 5 percentage points.
		const total = 400
		count := map[string]int{}
		for range total {
			r, err := w.client.TCP(webTCP, timeout)
			if err != nil {
				t.Fatalf("connection %d: %v", count["a"]+count["b"], err)
			}
			count[r.Name]++
		}
		share := float64(count["a"]) / total
		t.Logf("weighted split over %d new connections: %v (a's share %.3f, want 0.75 ± 0.05)", total, count, share)
		if share < 0.70 || share > 0.80 {
			t.Errorf("a answered %.1f%% of new connections, want 75%% ± 5", share*100)
		}
		// sh hashes the source: one client always reaches one pod (rr
		// over two equal endpoints would alternate).
		sh := map[string]int{}
		for range 20 {
			r, err := w.client.TCP(netip.AddrPortFrom(stickyVIP, 80), timeout)
			if err != nil {
				t.Fatal(err)
			}
			sh[r.Name]++
		}
		t.Logf("sh over 20 connections from one client: %v", sh)
		if len(sh) != 1 {
			t.Errorf("sh spread one source over %v, want a single pod", sh)
		}
	})

	t.Run("sigkill-restart", func(t *testing.T) {
		before := w.kernel(t)
		w.before = before
		if len(before.Servers) == 0 || !before.HasLink || len(before.Sets) == 0 {
			t.Fatalf("nothing programmed before the kill: %+v", before)
		}
		var okN, failN atomic.Int64
		var firstErr atomic.Value
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(6 * time.Minute)
			for i := 0; i < 20000 && time.Now().Before(deadline); i++ {
				select {
				case <-stop:
					return
				default:
				}
				dst := webTCP
				if i%2 == 1 {
					dst = netip.AddrPortFrom(w.node.LinkIP, 30080)
				}
				if _, err := w.client.TCP(dst, timeout); err != nil {
					failN.Add(1)
					firstErr.CompareAndSwap(nil, err)
				} else {
					okN.Add(1)
				}
			}
		}()
		halt := sync.OnceFunc(func() { close(stop); wg.Wait() })
		defer halt()
		until := func(n int64, what string) {
			w.waitFor(t, 2*time.Minute, what, func() error {
				if failN.Load() != 0 {
					return nil
				}
				if okN.Load() < n {
					return fmt.Errorf("%d answered", okN.Load())
				}
				return nil
			})
		}
		until(20, "stream started")
		w.stop(t, ag, syscall.SIGKILL)
		dead := okN.Load()
		until(dead+30, "connections answered while the agent is dead")
		if during := w.kernel(t); !sameKernel(during, before) {
			t.Errorf("kernel state changed while the agent was dead:\nbefore %+v\nduring %+v", before, during)
		}
		ag = w.start(t, "ipvs")
		restarted := okN.Load()
		until(restarted+50, "connections after the restart")
		halt()
		if n := failN.Load(); n != 0 {
			t.Errorf("%d of %d connections failed across SIGKILL and restart: %v", n, n+okN.Load(), firstErr.Load())
		}
		t.Logf("%d connections across SIGKILL and restart (%d while the agent was dead or not yet synced), %d failed",
			okN.Load()+failN.Load(), restarted-dead, failN.Load())
		if after := w.kernel(t); !sameKernel(after, before) {
			t.Errorf("kernel state after the restart differs:\nbefore %+v\nafter  %+v", before, after)
		}
	})

	t.Run("switch-to-iptables", func(t *testing.T) {
		w.stop(t, ag, syscall.SIGTERM)
		left := w.kernel(t)
		t.Logf("after SIGTERM of the ipvs agent: %d virtual servers, link %v %v, sets %v", len(left.Servers), left.HasLink, left.Link, left.Sets)
		if w.before.Servers != nil && !sameKernel(left, w.before) {
			t.Errorf("a stopped agent changed the kernel (its rules should stay in place):\nbefore %+v\nafter  %+v", w.before, left)
		}

		// The same node in iptables mode straight away converges and
		// removes IPVS mode's objects (issue 5: "switching a node between
		// modes cleans up the other mode's objects").
		t.Run("without-cleanup", func(t *testing.T) {
			ipt := w.start(t, "iptables")
			defer w.stop(t, ipt, syscall.SIGTERM)
			if k := w.kernel(t); len(k.Servers) != 0 || k.HasLink || len(k.Sets) != 0 {
				t.Errorf("iptables-mode agent left IPVS mode's objects: %d virtual servers, dummy link %v %v, EP- ipsets %v",
					len(k.Servers), k.HasLink, k.Link, k.Sets)
			}
		})

		var out []byte
		err := w.node.Do(func() error {
			cmd := exec.Command(w.bin, "cleanup", "--config", filepath.Join(w.dir, "config.yaml"))
			cmd.Env = agentEnv()
			var err error
			out, err = cmd.CombinedOutput()
			return err
		})
		t.Logf("edgeproxy cleanup (%v):\n%s", err, out)
		if !strings.Contains(string(out), "removed edgeproxy's IPVS virtual servers") {
			t.Errorf("edgeproxy cleanup did not report removing IPVS mode's objects")
		}
		if err != nil {
			t.Fatalf("edgeproxy cleanup: %v", err)
		}
		if k := w.kernel(t); len(k.Servers) != 0 || k.HasLink || len(k.Sets) != 0 {
			t.Errorf("after edgeproxy cleanup: %d virtual servers %v, dummy link %v, EP- sets %v; want none",
				len(k.Servers), k.Servers, k.HasLink, k.Sets)
		}
		for _, tool := range []string{"iptables-save", "ip6tables-save"} {
			if save, err := w.node.Run(tool); err != nil || strings.Contains(save, "EP-") {
				t.Errorf("after edgeproxy cleanup, %s still shows EP- chains or rules (%v):\n%s", tool, err, save)
			}
		}

		ipt := w.start(t, "iptables")
		w.waitFor(t, 30*time.Second, "client -> ClusterIP through iptables mode", func() error {
			r, err := w.client.TCP(webTCP, timeout)
			if err == nil && !w.pod(r) {
				err = fmt.Errorf("answered by %+v", r)
			}
			return err
		})
		r, err := w.client.TCP(netip.AddrPortFrom(w.node.LinkIP, 30080), timeout)
		if err != nil || !w.pod(r) {
			t.Errorf("client -> NodePort in iptables mode: %+v %v", r, err)
		}
		if k := w.kernel(t); len(k.Servers) != 0 || k.HasLink || len(k.Sets) != 0 {
			t.Errorf("iptables mode after cleanup holds IPVS objects: %+v", k)
		}
		if save, err := w.node.Run("iptables-save"); err != nil || strings.Contains(save, "EP-IPVS") {
			t.Errorf("iptables mode after cleanup holds EP-IPVS rules (%v)", err)
		}
		w.stop(t, ipt, syscall.SIGTERM)
	})
}

// sameKernel compares virtual servers (scheduler, flags, real servers and
// weights), the dummy link's addresses and the set names.
func sameKernel(a, b kernel) bool {
	if len(a.Servers) != len(b.Servers) || a.HasLink != b.HasLink || !slices.Equal(a.Link, b.Link) || !slices.Equal(a.Sets, b.Sets) {
		return false
	}
	for k, v := range a.Servers {
		o, ok := b.Servers[k]
		if !ok || o.Scheduler != v.Scheduler || o.Flags != v.Flags || !maps.Equal(o.Reals, v.Reals) {
			return false
		}
	}
	return true
}
