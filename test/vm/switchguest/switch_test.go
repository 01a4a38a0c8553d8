package switchguest

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/ipset"
	"github.com/edgeproxy/edgeproxy/datapath/ipvs"
	"github.com/edgeproxy/edgeproxy/datapath/kubeproxy"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/internal/testkit/switchload"
	"github.com/edgeproxy/edgeproxy/internal/testkit/vm"
	"github.com/edgeproxy/edgeproxy/test/proxies"
)

var sharedDir = flag.String("switch.dir", "", "run a switch test with the host's world in this directory")

// conntrackMax is kube-proxy's minimum conntrack table (conntrack.min).
const conntrackMax = 131072

// userVS is a user's IPVS service, unrelated to Kubernetes, on an address
// that is neither a service's nor the node's: neither the takeover nor
// `edgeproxy cleanup` may touch it.
var userVS = ipvs.VirtualServer{Addr: netip.MustParseAddr("192.0.2.50"), Protocol: datapath.TCP, Port: 8000, Scheduler: "rr"}

// TestSwitchKubeProxyIPVSGuest switches a live node from kube-proxy
// --proxy-mode=ipvs to edgeproxy mode ipvs and back, then to edgeproxy
// mode iptables, as a user does:
//
//   - kube-proxy → edgeproxy: kube-proxy is stopped (its virtual servers,
//     kube-ipvs0, ipsets and chains stay and keep answering), edgeproxy
//     started: it adopts the virtual servers it programs too, then
//     removes the rest of kube-proxy's;
//   - edgeproxy → kube-proxy: edgeproxy is stopped (its objects stay),
//     kube-proxy started: it adopts the virtual servers of the keys it
//     programs; once it has synced, `edgeproxy cleanup` removes the rest
//     of edgeproxy's and leaves kube-proxy's. (Cleaning up first, as in
//     iptables mode, takes the service addresses off the node until
//     kube-proxy's first sync: established flows stall for that long, and
//     under TCG every one of them broke.);
//   - kube-proxy → edgeproxy in iptables mode (a user who leaves IPVS as
//     they switch): kube-proxy stopped, edgeproxy started; after its
//     first sync it removes kube-proxy's chains, virtual servers,
//     kube-ipvs0 and ipsets. The flows established through kube-proxy's
//     virtual servers break (counted, not held: see below).
//
// While no proxy runs, pod c leaves web (the host deletes it; its server
// stays up, so a connection that reaches it shows stale state). The
// counts and the target are test/netns/e2e's TestSwitchKubeProxy's: per
// switch, 0 new connections failed after the new proxy's first sync, 0 to
// the deleted endpoint, 0 established flows broken (but iptables mode's).
func TestSwitchKubeProxyIPVSGuest(t *testing.T) {
	w := newWorld(t, proxies.ModeIPVS, proxies.ModeIPTables)
	node, client, setup, start := w.node, w.client, w.setup, w.start
	cfg := w.configs[proxies.ModeIPVS]
	path := w.path
	host, startProxy, synced, reaches := w.host, w.startProxy, w.synced, w.reaches

	t.Logf("world ready in %s", time.Since(start).Round(100*time.Millisecond))
	first := time.Now()
	cur := startProxy(proxies.KubeProxy, proxies.ModeIPVS)
	curKind, curMode := proxies.KubeProxy, proxies.ModeIPVS
	synced(curKind, curMode, cur)
	t.Logf("kube-proxy ipvs synced %s after its start", time.Since(first).Round(100*time.Millisecond))
	reaches(WebVIP, "c")
	// kube-proxy answers the externalIP: what its leftovers would go on
	// answering after a takeover that left them.
	reaches(ExternalIP, "a")
	t.Logf("kube-proxy ipvs synced: %s", kernelSummary(t, node))
	var report []string
	srcPorts := switchload.NewSourcePorts(PodPort, HeldPort)
	// kube-proxy IPVS → edgeproxy IPVS → kube-proxy IPVS (the way back)
	// → edgeproxy iptables (a user who leaves IPVS as they switch).
	type step struct {
		kind proxies.Kind
		mode string
	}
	order := []step{{proxies.EdgeProxy, proxies.ModeIPVS}, {proxies.KubeProxy, proxies.ModeIPVS}, {proxies.EdgeProxy, proxies.ModeIPTables}}
	for i, st := range order {
		next := st.kind
		what := fmt.Sprintf("%s %s → %s %s", curKind, curMode, next, st.mode)
		began := time.Now()
		sw := switchload.Start(t, client, srcPorts, WebVIP, SteadyVIP, HeldPort)
		sw.WaitNew(20)
		cur.Stop()
		host("delete", "c")
		sw.Deleted()
		started := time.Now()
		p := startProxy(next, st.mode)
		synced(next, st.mode, p)
		phases := fmt.Sprintf("pod c deleted in %s, %s synced %s after its start",
			started.Sub(began).Round(100*time.Millisecond), next, time.Since(started).Round(100*time.Millisecond))
		var changes func() string
		var ctStats string
		if next != proxies.EdgeProxy {
			// The way back: kube-proxy has synced (it adopted the
			// virtual servers of the keys it programs), then
			// `edgeproxy cleanup` removes the rest, under the stream.
			sw.Switched()
			// The kernel's route and address changes from here on,
			// timestamped, to set against the failures' times.
			changes = monitor(t, node.NS, "ip", "-ts", "monitor", "route", "address")
			ctStats, _ = node.Run("conntrack", "-S")
			cleanup := time.Now()
			out, err := node.Run("env", "PATH="+path+":"+os.Getenv("PATH"), "EDGEPROXY_LOG_LEVEL=debug",
				setup.EdgeProxy, "cleanup", "--config", cfg)
			if err != nil {
				t.Fatalf("edgeproxy cleanup: %v: %s", err, out)
			}
			phases += fmt.Sprintf(", edgeproxy cleanup %s (%s to %s)", time.Since(cleanup).Round(100*time.Millisecond),
				cleanup.Format("15:04:05.000"), time.Now().Format("15:04:05.000"))
			t.Logf("edgeproxy cleanup (timed):\n%s", out)
			assertNoEdgeProxyObjects(t, node)
		} else {
			assertNoKubeProxyObjects(t, node, st.mode)
			logPhases(t, what, p.Log)
			// The externalIP kube-proxy served is answered no more:
			// edgeproxy leaves externalIPs off, and kube-proxy's
			// virtual server and address are gone.
			if r, err := client.TCP(netip.AddrPortFrom(ExternalIP, 80), time.Second); err == nil {
				t.Errorf("%s: the externalIP kube-proxy served still answers (%s)", what, r.Name)
			}
		}
		sw.Switched() // again on the way back: a no-op
		sw.WaitNew(100)
		sw.WaitExchanges(5 * (switchload.HeldFlows + switchload.UDPFlows))
		res := sw.Stop()
		if changes != nil {
			t.Logf("%s: route and address changes from the cleanup on:\n%s", what, changes())
			after, _ := node.Run("conntrack", "-S")
			t.Logf("%s: conntrack statistics when kube-proxy had synced:\n%s\nand at the end:\n%s", what, ctStats, after)
		}
		report = append(report, fmt.Sprintf("%s: %s", what, res))
		if len(res.Failures) > 0 {
			if out, err := os.ReadFile(p.Log); err == nil {
				var lines []string
				for _, l := range strings.Split(string(out), "\n") {
					if !strings.Contains(l, "flags.go") && !strings.Contains(l, "informer") && !strings.Contains(l, "reflector") {
						lines = append(lines, l)
					}
				}
				t.Logf("%s: the log of %s (tail, without flags and informers):\n%s", what, next, proxies.Tail(strings.Join(lines, "\n"), 80))
			}
		}
		t.Logf("%s: %s; %s in all; kernel after: %s", what, phases, time.Since(began).Round(100*time.Millisecond), kernelSummary(t, node))
		// The way back failed a few new connections (4 to 7 of 400-2,700
		// in three of nine runs) until the conntrack table above was
		// sized as on a node: the failing runs counted conntrack drops.
		// Every switch now holds 0.
		// Established flows through kube-proxy's virtual servers do not
		// survive a takeover by iptables mode: their conntrack entries
		// carry no NAT of their own (IPVS did it), and the virtual
		// servers and kube-ipvs0 go (deploy/README.md). Measured, not
		// held.
		judge(t, what, res, st.mode == proxies.ModeIPVS, "iptables mode does not carry IPVS's connections over")
		cur, curKind, curMode = p, next, st.mode
		if i < len(order)-1 { // c serves again for the next switch
			host("add", "c")
			reaches(WebVIP, "c")
		}
	}
	assertUserVS(t, node)
	t.Logf("IPVS switch summary (%s):\n  %s", time.Since(start).Round(time.Second), strings.Join(report, "\n  "))
}

// guestEnv is the environment with the backend's programs first in PATH,
// without the VM's marker (the agent would read it as a misspelt
// EDGEPROXY_* config key).
func guestEnv(path string) []string {
	var env []string
	for _, e := range proxies.Env(path) {
		if !strings.HasPrefix(e, vm.GuestEnv+"=") {
			env = append(env, e)
		}
	}
	return env
}

// nodeKernel is what the node holds of IPVS: virtual servers, the
// addresses of each dummy link, and the ipset names.
type nodeKernel struct {
	servers []ipvs.VirtualServer
	links   map[string][]netip.Addr
	sets    []string
}

func readKernel(t *testing.T, node *netns.Node) nodeKernel {
	t.Helper()
	k := nodeKernel{links: map[string][]netip.Addr{}}
	if err := node.Do(func() error {
		h, err := ipvs.Open()
		if err != nil {
			return err
		}
		defer h.Close()
		if k.servers, err = h.VirtualServers(); err != nil {
			return err
		}
		k.sets, err = ipset.Netlink{}.Names()
		return err
	}); err != nil {
		t.Fatalf("reading the node's IPVS state: %v", err)
	}
	links, err := node.Netlink().LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if l.Type() != "dummy" {
			continue
		}
		as, err := node.Netlink().AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			t.Fatal(err)
		}
		k.links[l.Attrs().Name] = []netip.Addr{}
		for _, a := range as {
			if ip, ok := netip.AddrFromSlice(a.IP); ok && !ip.IsLinkLocalUnicast() {
				k.links[l.Attrs().Name] = append(k.links[l.Attrs().Name], ip.Unmap())
			}
		}
	}
	return k
}

func kernelSummary(t *testing.T, node *netns.Node) string {
	k := readKernel(t, node)
	var links []string
	for name, as := range k.links {
		links = append(links, fmt.Sprintf("%s (%d addresses)", name, len(as)))
	}
	return fmt.Sprintf("%d virtual servers, dummy links %v, ipsets %v", len(k.servers), links, k.sets)
}

// assertNoKubeProxyObjects fails t if anything of kube-proxy's is left in
// the node after the takeover by edgeproxy in mode: a KUBE-* chain (either
// backend), kube-ipvs0, a KUBE-* ipset, or a virtual server that is not
// edgeproxy's (IPVS mode: on an address of edgeproxy0; iptables mode has
// none) or the user's.
func assertNoKubeProxyObjects(t *testing.T, node *netns.Node, mode string) {
	t.Helper()
	for _, save := range []string{"iptables-nft-save", "iptables-legacy-save"} {
		out, err := node.Run(save)
		if err != nil {
			t.Fatal(err)
		}
		for _, chain := range []string{"KUBE-SERVICES", "KUBE-POSTROUTING", "KUBE-PROXY-", "KUBE-IPVS-", "KUBE-NODE-PORT", "KUBE-LOAD-BALANCER", "KUBE-MARK-MASQ"} {
			if strings.Contains(out, chain) {
				t.Errorf("%s: kube-proxy's %s left after the takeover", save, chain)
			}
		}
	}
	k := readKernel(t, node)
	if _, ok := k.links[kubeproxy.KubeIPVSLink]; ok {
		t.Errorf("%s left after the takeover, with %v", kubeproxy.KubeIPVSLink, k.links[kubeproxy.KubeIPVSLink])
	}
	for _, s := range k.sets {
		if strings.HasPrefix(s, "KUBE-") {
			t.Errorf("kube-proxy's ipset %s left after the takeover", s)
		}
	}
	ours := map[netip.Addr]bool{}
	for _, a := range k.links["edgeproxy0"] {
		ours[a] = true
	}
	switch as, ok := k.links["edgeproxy0"]; {
	case mode == proxies.ModeIPVS && (!ours[WebVIP] || !ours[SteadyVIP]):
		t.Errorf("edgeproxy0 holds %v, want %s and %s", as, WebVIP, SteadyVIP)
	case mode != proxies.ModeIPVS && ok:
		t.Errorf("edgeproxy0 (%v) in %s mode", as, mode)
	}
	for _, v := range k.servers {
		if v.Key() != userVS.Key() && !ours[v.Addr] {
			t.Errorf("virtual server %s left after the takeover: not edgeproxy's, not the user's", v)
		}
	}
	assertUserVS(t, node)
}

// assertNoEdgeProxyObjects fails t if an edgeproxy object is left after
// `edgeproxy cleanup`: an EP- chain or rule, edgeproxy0, an EP- ipset, a
// virtual server but kube-proxy's (on kube-ipvs0's addresses) and the
// user's. kube-proxy's must still be there.
func assertNoEdgeProxyObjects(t *testing.T, node *netns.Node) {
	t.Helper()
	for _, save := range []string{"iptables-nft-save", "iptables-legacy-save"} {
		out, err := node.Run(save)
		if err != nil {
			t.Fatal(err)
		}
		if edgeProxyChain.MatchString(out) {
			t.Errorf("%s: edgeproxy rules left after `edgeproxy cleanup`:\n%s", save, out)
		}
	}
	k := readKernel(t, node)
	if _, ok := k.links["edgeproxy0"]; ok {
		t.Errorf("edgeproxy0 left after `edgeproxy cleanup`")
	}
	for _, s := range k.sets {
		if strings.HasPrefix(s, "EP-") {
			t.Errorf("ipset %s left after `edgeproxy cleanup`", s)
		}
	}
	kube := map[netip.Addr]bool{}
	for _, a := range k.links[kubeproxy.KubeIPVSLink] {
		kube[a] = true
	}
	if !kube[WebVIP] || !kube[SteadyVIP] {
		t.Errorf("%s holds %v, want %s and %s", kubeproxy.KubeIPVSLink, k.links[kubeproxy.KubeIPVSLink], WebVIP, SteadyVIP)
	}
	// Each kube-ipvs0 address is still local: removing edgeproxy0, which
	// held the same addresses, took only its own local routes.
	local, err := node.Run("ip", "-4", "route", "show", "table", "local", "dev", kubeproxy.KubeIPVSLink)
	if err != nil {
		t.Fatal(err)
	}
	for a := range kube {
		if a.Is4() && !strings.Contains(local, "local "+a.String()+" ") {
			t.Errorf("%s's address %s has no local route after `edgeproxy cleanup`:\n%s", kubeproxy.KubeIPVSLink, a, local)
		}
	}
	have := map[netip.Addr]bool{}
	for _, v := range k.servers {
		have[v.Addr] = true
		if v.Key() != userVS.Key() && !kube[v.Addr] {
			t.Errorf("virtual server %s left after `edgeproxy cleanup`: not kube-proxy's, not the user's", v)
		}
	}
	if !have[WebVIP] || !have[SteadyVIP] {
		t.Errorf("`edgeproxy cleanup` removed kube-proxy's virtual servers: %v", k.servers)
	}
	assertUserVS(t, node)
}

func assertUserVS(t *testing.T, node *netns.Node) {
	t.Helper()
	for _, v := range readKernel(t, node).servers {
		if v.Key() == userVS.Key() {
			return
		}
	}
	t.Errorf("the user's virtual server %s is gone", userVS.Key())
}

// edgeProxyChain finds an edgeproxy chain (EP-…, not KUBE-SEP-…) in a
// listing.
var edgeProxyChain = regexp.MustCompile(`(?m)(^:|^-A |-j )EP-`)

// monitor runs a command in ns until the test ends; the function it
// returns stops it and returns its output.
func monitor(t *testing.T, ns *netns.NS, name string, args ...string) func() string {
	t.Helper()
	var buf bytes.Buffer
	var mu sync.Mutex
	cmd := exec.Command(name, args...)
	w := &lockedWriter{w: &buf, mu: &mu}
	cmd.Stdout, cmd.Stderr = w, w
	if err := ns.Do(cmd.Start); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var once sync.Once
	stop := func() string {
		once.Do(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		mu.Lock()
		defer mu.Unlock()
		return buf.String()
	}
	t.Cleanup(func() { stop() })
	return stop
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
