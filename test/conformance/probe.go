package conformance

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// Probe bounds. A probe that gets no answer in probeTimeout counts as
// dropped; these are bounds on a wait, never assertions about speed.
const (
	probeTimeout = 2 * time.Second
	// maxProbes per cell: with two candidate endpoints the chance that one
	// is never picked is 2^-(maxProbes-1).
	maxProbes = 30
	// noAnswerLimit ends a cell that got nothing but refusals or timeouts.
	noAnswerLimit = 2
)

// Outcome is what a cell's client saw.
type Outcome struct {
	Endpoints []string // the endpoints that answered
	Sources   []string // the client addresses they saw
	Failures  []string // refused, timeout, unreachable, syn-resent, ...
	Sticky    bool     // every answer from one endpoint (ClientIP affinity)
	Text      string   // for the health check and the stale-conntrack cells
}

// nothing is the outcome of a cell whose probes never ran (or that was
// never probed at all): it fails the cell whatever the other column says.
const nothing = "nothing"

// synResent is a failure: a TCP probe connected, but only after its SYN
// was sent again (the kernel's first resend is after 1 s). Every address
// of the world is a hop or two away, so a resent SYN is a dropped one:
// a stall of 1 s or more that a longer probe timeout would hide.
const synResent = "syn-resent"

// nodeLink names, in the sources of affinity cells, the node's own address
// on the link to the endpoint that answered (node/br for a pod of this
// node, node/remote-link for one of node-b): which endpoint a sticky
// client lands on is chance, and with it which of those the node uses.
const nodeLink = "node/link-to-endpoint"

// String is the outcome as the matrix prints and compares it.
func (o Outcome) String() string {
	if o.Text != "" {
		return o.Text
	}
	var parts []string
	if len(o.Endpoints) > 0 {
		if o.Sticky {
			// Which endpoint is chance; that it is always the same is
			// not, nor the source it saw (see nodeLink).
			parts = append(parts, "one-sticky from "+strings.Join(o.Sources, ","))
		} else {
			parts = append(parts, strings.Join(o.Endpoints, ",")+" from "+strings.Join(o.Sources, ","))
		}
	}
	parts = append(parts, o.Failures...)
	if len(parts) == 0 {
		return nothing
	}
	return strings.Join(parts, " + ")
}

// client returns the namespace of a position.
func (w *World) client(position string) *netns.NS {
	switch position {
	case "pod":
		return w.Pods["cpod"].NS
	case "outpod":
		return w.Pods["outpod"].NS
	case "node":
		return w.Node.NS
	case "ext":
		return w.Ext
	case "rpod":
		return w.Pods["rc"].NS
	}
	panic("conformance: unknown position " + position)
}

// target is the address:port a cell sends to.
func (w *World) target(c Cell) (netip.AddrPort, error) {
	svc := w.service(c.Shape.Name)
	v6 := c.Family == "v6"
	pick := func(addrs []string) (netip.Addr, error) {
		for _, s := range addrs {
			a, err := netip.ParseAddr(s)
			if err == nil && a.Is6() == v6 {
				return a, nil
			}
		}
		return netip.Addr{}, fmt.Errorf("service %s has no %s address in %v", svc.Name, c.Family, addrs)
	}
	if c.Port >= len(svc.Spec.Ports) {
		return netip.AddrPort{}, fmt.Errorf("service %s has no port %d", svc.Name, c.Port)
	}
	port := svc.Spec.Ports[c.Port]
	nodePort, servicePort := uint16(port.NodePort), uint16(port.Port)
	switch c.Frontend {
	case FClusterIP:
		a, err := pick(svc.Spec.ClusterIPs)
		return netip.AddrPortFrom(a, servicePort), err
	case FNodePort:
		return netip.AddrPortFrom(fam(v6, nodeIP4, nodeIP6), nodePort), nil
	case FNodePortBr:
		return netip.AddrPortFrom(fam(v6, w.Node.Gateway, w.Node.Gateway6), nodePort), nil
	case FNodePortLo:
		return netip.AddrPortFrom(fam(v6, netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()), nodePort), nil
	case FNodePortX:
		return netip.AddrPortFrom(fam(v6, client4, client6), nodePort), nil
	case FLB:
		a, err := pick(ingressIPs(svc))
		return netip.AddrPortFrom(a, servicePort), err
	case FExtIP:
		a, err := pick(svc.Spec.ExternalIPs)
		return netip.AddrPortFrom(a, servicePort), err
	case FHealth:
		return netip.AddrPortFrom(fam(v6, nodeIP4, nodeIP6), uint16(svc.Spec.HealthCheckNodePort)), nil
	case FHostPortCIP:
		a, err := pick(svc.Spec.ClusterIPs)
		return netip.AddrPortFrom(a, hostDaemonPort), err
	case FHostPortLB:
		a, err := pick(ingressIPs(svc))
		return netip.AddrPortFrom(a, hostDaemonPort), err
	case FHostPortLo:
		return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), hostDaemonPort), nil
	case FHealthz, FLivez, FHealthzDraining, FLivezDraining:
		return netip.AddrPortFrom(nodeIP4, healthzPort), nil
	}
	return netip.AddrPort{}, fmt.Errorf("unknown frontend %q", c.Frontend)
}

// ingressIPs are the LB IPs of svc's status.
func ingressIPs(svc *corev1.Service) []string {
	var ips []string
	for _, in := range svc.Status.LoadBalancer.Ingress {
		ips = append(ips, in.IP)
	}
	return ips
}

func fam(v6 bool, a4, a6 netip.Addr) netip.Addr {
	if v6 {
		return a6
	}
	return a4
}

// Probe runs one cell's probes and returns its outcome.
func (w *World) Probe(ctx context.Context, c Cell) Outcome {
	dst, err := w.target(c)
	if err != nil {
		return Outcome{Failures: []string{"harness: " + err.Error()}}
	}
	from := w.client(c.Position)
	if c.Frontend == FHealth {
		return Outcome{Text: w.health(from, dst)}
	}
	if c.Frontend == FHealthz || c.Frontend == FLivez || draining(c.Frontend) {
		return Outcome{Text: w.proxyHealth(from, dst, "/"+strings.TrimSuffix(c.Frontend, "-draining"))}
	}
	if c.Shape.AffinityTimeout > 0 {
		return Outcome{Text: w.expiry(ctx, from, dst, c)}
	}
	eps, srcs, fails := map[string]bool{}, map[string]bool{}, map[string]bool{}
	answers, noAnswer := 0, 0
	for i := 0; i < w.probes && ctx.Err() == nil; i++ {
		r, resent, err := w.send(from, c.proto() == udp, dst, w.timeout)
		if resent {
			fails[synResent] = true
		}
		if err != nil {
			fails[classify(err)] = true
			noAnswer++
			if answers == 0 && noAnswer >= noAnswerLimit {
				break
			}
			continue
		}
		answers++
		eps[r.Name] = true
		src := w.name(r.Client.Addr())
		if c.Shape.Affinity && src == linkTo(r.Name) {
			src = nodeLink
		}
		srcs[src] = true
		// Every candidate answered: more probes cannot add one.
		if len(eps) == candidates(c) && len(fails) == 0 {
			break
		}
	}
	o := Outcome{Endpoints: sorted(eps), Sources: sorted(srcs), Failures: sorted(fails)}
	o.Sticky = c.Shape.Affinity && len(eps) == 1 && answers > 1
	return o
}

// Probe source ports: every probe of a run takes the next one, so that
// no four-tuple comes back within a run (about 17,000 probes for the two
// proxies of the IPVS matrix). IPVS keeps a connection for minutes after it
// ends (TIME_WAIT 2 min), also across the proxies of one run, and with
// net.ipv4.vs.conntrack=1 drops the first SYN that reuses its tuple: the
// client's kernel, which chooses ports by destination, reuses them when the
// server closed first. The range is below the ephemeral ports (32768+)
// and the NodePorts (30000+), and above the change cells' flows
// (firstChangePort) and the ports the proxies listen on (10249, 10256).
const (
	firstSrcPort = 12000
	lastSrcPort  = 29999
)

// send probes dst once from a port of its own, skipping a port that is in
// use in the client's namespace. resent reports a TCP probe whose SYN had
// to be sent again before it connected.
func (w *World) send(from *netns.NS, isUDP bool, dst netip.AddrPort, timeout time.Duration) (r netns.Reply, resent bool, err error) {
	for range 8 {
		port := uint16(firstSrcPort + w.nextPort.Add(1)%(lastSrcPort-firstSrcPort+1))
		if isUDP {
			r, err = from.UDP(dst, port, timeout)
		} else {
			r, resent, err = tcpEcho(from, dst, port, timeout)
		}
		if !errors.Is(err, syscall.EADDRINUSE) && !errors.Is(err, syscall.EADDRNOTAVAIL) {
			return r, resent, err
		}
	}
	return netns.Reply{}, false, fmt.Errorf("harness: no free source port near %d", firstSrcPort+w.nextPort.Load()%(lastSrcPort-firstSrcPort+1))
}

// dialTCP connects from the namespace to dst from srcPort (0: any) and
// reports whether the SYN was sent more than once: the socket's count of
// retransmitted segments (TCP_INFO tcpi_total_retrans), read as soon as the
// connection is up, when nothing but the SYN can have been resent.
func dialTCP(from *netns.NS, dst netip.AddrPort, srcPort uint16, timeout time.Duration) (net.Conn, bool, error) {
	var c net.Conn
	err := from.Do(func() error {
		d := &net.Dialer{Timeout: timeout}
		if srcPort != 0 {
			d.LocalAddr = &net.TCPAddr{Port: int(srcPort)}
		}
		var err error
		c, err = d.Dial("tcp", dst.String())
		return err
	})
	if err != nil {
		return nil, false, err
	}
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		c.Close()
		return nil, false, fmt.Errorf("harness: %w", err)
	}
	var info *unix.TCPInfo
	cerr := raw.Control(func(fd uintptr) {
		info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	})
	if err = errors.Join(cerr, err); err != nil {
		c.Close()
		return nil, false, fmt.Errorf("harness: TCP_INFO: %w", err)
	}
	return c, info.Total_retrans > 0, nil
}

// tcpEcho is one TCP probe: it connects (dialTCP) and reads the echo
// server's reply, each within timeout.
func tcpEcho(from *netns.NS, dst netip.AddrPort, srcPort uint16, timeout time.Duration) (netns.Reply, bool, error) {
	c, resent, err := dialTCP(from, dst, srcPort, timeout)
	if err != nil {
		return netns.Reply{}, false, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return netns.Reply{}, resent, fmt.Errorf("read from %s: %w", dst, err)
	}
	r, err := parseEcho(line)
	return r, resent, err
}

// parseEcho reads an echo server's reply: "<name> <client address:port>".
func parseEcho(s string) (netns.Reply, error) {
	f := strings.Fields(s)
	if len(f) != 2 {
		return netns.Reply{}, fmt.Errorf("harness: malformed echo reply %q", s)
	}
	ap, err := netip.ParseAddrPort(f[1])
	if err != nil {
		return netns.Reply{}, fmt.Errorf("harness: malformed echo reply %q: %w", s, err)
	}
	return netns.Reply{Name: f[0], Client: netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())}, nil
}

// linkTo is the name of the node's address on the link to a pod: the
// bridge for its own pods, the node-to-node link for node-b's and node-c's.
func linkTo(pod string) string {
	if _, ok := remotePods[pod]; ok {
		return "node/remote-link"
	}
	if slices.Contains(localPods, pod) {
		return "node/br"
	}
	return ""
}

// candidates is how many different endpoints can answer a cell.
func candidates(c Cell) int {
	if c.Frontend == FHostPortCIP || c.Frontend == FHostPortLB || c.Frontend == FHostPortLo {
		return 1 // the host daemon
	}
	return len(c.Shape.Pods)
}

// health asks a healthCheckNodePort and returns "http <code> local=<n>".
// The connection is dialled on the namespace's thread: net/http would dial
// from another goroutine, outside the namespace.
func (w *World) health(from *netns.NS, dst netip.AddrPort) string {
	conn, resent, err := dialTCP(from, dst, 0, w.timeout)
	if err != nil {
		return classify(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(w.timeout))
	if _, err := fmt.Fprintf(conn, "GET / HTTP/1.0\r\nHost: %s\r\n\r\n", dst); err != nil {
		return classify(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return classify(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	var v struct {
		LocalEndpoints int `json:"localEndpoints"`
	}
	_ = json.Unmarshal(body, &v)
	out := "http " + strconv.Itoa(resp.StatusCode) + " local=" + strconv.Itoa(v.LocalEndpoints)
	if resent {
		out += " + " + synResent
	}
	return out
}

// proxyHealth asks the proxy's own health server for path and returns
// "http <code>" (the bodies hold timestamps, and each proxy its own
// fields: the status is what load balancers and kubelets act on).
func (w *World) proxyHealth(from *netns.NS, dst netip.AddrPort, path string) string {
	conn, resent, err := dialTCP(from, dst, 0, w.timeout)
	if err != nil {
		return classify(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(w.timeout))
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, dst); err != nil {
		return classify(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return classify(err)
	}
	resp.Body.Close()
	out := "http " + strconv.Itoa(resp.StatusCode)
	if resent {
		out += " + " + synResent
	}
	return out
}

// classify names a probe failure.
func classify(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "unreachable"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF):
		return "reset"
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EACCES):
		return "prohibited"
	}
	return "error(" + err.Error() + ")"
}

func sorted(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// changeFlow is an established UDP flow of a change cell.
type changeFlow struct {
	cell    Cell
	dst     netip.AddrPort
	port    uint16 // the client's source port, kept across the change
	before  string
	outcome string
}

// firstChangePort is the first client source port of the change cells'
// flows (one each, in a run's order): below the probes' own ports
// (firstSrcPort) and the ephemeral ports, so that no other socket of the
// client's namespace holds it.
const firstChangePort = 11000

// Changes runs the change cells of one proxy run (Shape.Change), one
// goroutine per shape: the shapes are different Services. It returns
// once every shape's world is put back.
func (w *World) Changes(ctx context.Context, cells []Cell) map[string]Outcome {
	var order []*Shape
	byShape := map[*Shape][]Cell{}
	for _, c := range cells {
		if byShape[c.Shape] == nil {
			order = append(order, c.Shape)
		}
		byShape[c.Shape] = append(byShape[c.Shape], c)
	}
	out := map[string]Outcome{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	port := uint16(firstChangePort)
	for _, s := range order {
		wg.Add(1)
		go func(first uint16) {
			defer wg.Done()
			res := w.change(ctx, s, byShape[s], first)
			mu.Lock()
			maps.Copy(out, res)
			mu.Unlock()
		}(port)
		port += uint16(len(byShape[s]))
	}
	wg.Wait()
	return out
}

// change runs one change shape's cells: each opens a UDP flow from a
// fixed source port to its frontend and notes who answered; the Service
// is changed (applyChange); once new flows show the change (bounded),
// each old flow sends again, from the same port, until it shows the
// change too or staleClearWait passes: what it reaches then is the
// proxy's conntrack cleanup (upstream's pkg/proxy/conntrack/cleanup.go
// removes UDP entries of a Service port that has serving endpoints and
// whose reply does not come from one of them). The Service is put back
// before it returns.
func (w *World) change(ctx context.Context, s *Shape, cells []Cell, firstPort uint16) map[string]Outcome {
	out := map[string]Outcome{}
	var flows []*changeFlow
	for i, c := range cells {
		dst, err := w.target(c)
		if err != nil {
			out[c.Key()] = Outcome{Text: "harness: " + err.Error()}
			continue
		}
		flows = append(flows, &changeFlow{cell: c, dst: dst, port: firstPort + uint16(i)})
	}
	// All at once: the flows' conntrack entries must not expire (see
	// keepAlive) before the change.
	var wg sync.WaitGroup
	for _, f := range flows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.before = w.udpOnce(w.client(f.cell.Position), f.dst, f.port)
		}()
	}
	wg.Wait()
	if err := w.applyChange(ctx, s, true); err != nil {
		for _, f := range flows {
			out[f.cell.Key()] = Outcome{Text: "harness: " + err.Error()}
		}
		return out
	}
	for _, f := range flows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.outcome = w.afterChange(ctx, f)
		}()
	}
	wg.Wait()
	for _, f := range flows {
		out[f.cell.Key()] = Outcome{Text: f.outcome}
	}
	if err := w.applyChange(ctx, s, false); err != nil {
		w.t.Errorf("put %s back: %v", s.Name, err)
	}
	return out
}

// changeWant is, per change, the endpoint a new flow reaches once the
// proxy has the change (the old one reaches it too once its entry is
// cleared); "" is none: anything but sa, where it went before.
var changeWant = map[string]struct{ newFlow, cleared string }{
	ChangeReplace: {"sb", "sb"},
	ChangeAdd:     {"sa", "sa"},
	ChangeRemove:  {"", ""},
	ChangeDelete:  {"", ""},
	ChangePort:    {"sa", ""}, // new flows to the new port
}

// afterChange waits (bounded) until a new flow, from another source port,
// shows the change, then asks the old flow (see change) and says what it
// reached: "before <endpoint>, old flow after <change>: <outcome>".
func (w *World) afterChange(ctx context.Context, f *changeFlow) string {
	kind := f.cell.Shape.Change
	want := changeWant[kind]
	shows := func(o, want string) bool { return o == want || want == "" && o != "sa" }
	newDst, err := w.target(f.cell) // after ChangePort: the new port
	if err != nil {
		return "harness: " + err.Error()
	}
	from := w.client(f.cell.Position)
	var lastOld time.Time
	for deadline := time.Now().Add(newFlowWait); ; {
		if time.Since(lastOld) >= keepAlive {
			w.udpOnce(from, f.dst, f.port) // what it reaches is asked below
			lastOld = time.Now()
		}
		o := w.udpOnce(from, newDst, 0)
		if shows(o, want.newFlow) {
			break
		}
		if !time.Now().Before(deadline) || ctx.Err() != nil {
			return fmt.Sprintf("before %s, new flows after %s: %s", f.before, kind, o)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// A proxy clears conntrack after it writes the rules, and on a loaded
	// machine that can take a while: the old flow is asked (bounded) until
	// it shows the change. A proxy that never clears keeps answering from
	// the old endpoint, so the outcome is the same however long the wait;
	// only a slow clear stops looking like a missing one. Where the change
	// is that the flow no longer reaches sa, the same failure twice in a
	// row ends it: in IPVS mode the first packet of a flow whose real
	// server is gone is dropped (expire_nodest_conn, while its conntrack
	// entry lives), the next one is refused or scheduled again.
	//
	// New flows showing the change says that the sync writing it has
	// started, not that it has ended: kube-proxy's IPVS mode adds the new
	// virtual servers Service by Service, deletes the stale ones at the
	// end of its sync (cleanLegacyService in pkg/proxy/ipvs/proxier.go),
	// then clears conntrack. In the VM such a sync can outlast
	// staleClearWait, and an old flow to a changed port still reached sa
	// through the old virtual server. So staleClearWait counts from when
	// a sync of the flow's family has ended since new flows showed the
	// change, or, if none ends, from when the proxy's longest sync so far
	// would have.
	shown := time.Now()
	family := map[string]string{"v4": "IPv4", "v6": "IPv6"}[f.cell.Family]
	before, err := w.syncs(family)
	if err != nil {
		return "harness: " + err.Error()
	}
	var synced time.Time
	prev := ""
	for {
		o := w.udpOnce(from, f.dst, f.port)
		done := o == want.cleared || want.cleared == "" && o != "sa" && o == prev
		if done || !synced.IsZero() && time.Since(synced) >= staleClearWait || ctx.Err() != nil {
			return fmt.Sprintf("before %s, old flow after %s: %s", f.before, kind, o)
		}
		if synced.IsZero() {
			now, err := w.syncs(family)
			if err != nil {
				return "harness: " + err.Error()
			}
			if now.count > before.count || time.Since(shown) >= before.longest {
				synced = time.Now()
				if waited := synced.Sub(shown); waited >= staleClearWait {
					w.t.Logf("%s: the proxy's sync ended %s after new flows showed the change", f.cell.Key(), waited.Round(time.Millisecond))
				}
			}
		}
		prev = o
		time.Sleep(250 * time.Millisecond)
	}
}

// syncs reads the proxy's syncs of family from its metrics (parseSyncs).
func (w *World) syncs(family string) (syncs, error) {
	m, err := w.metrics()
	if err != nil {
		return syncs{}, err
	}
	return parseSyncs(m, family)
}

// udpOnce sends one datagram from port (0: a probe port of its own, see
// send) and names who answered, or the failure.
func (w *World) udpOnce(from *netns.NS, dst netip.AddrPort, port uint16) string {
	var r netns.Reply
	var err error
	if port == 0 {
		r, _, err = w.send(from, true, dst, w.timeout)
	} else {
		r, err = from.UDP(dst, port, w.timeout)
	}
	if err != nil {
		return classify(err)
	}
	return r.Name
}

// newFlowWait bounds how long a change cell waits for a new flow to show
// the change. In the VM (TCG), kube-proxy IPVS's new flows still reached
// a deleted Service's endpoint 30 s after the delete in one run, in 6 of
// its 8 cells (its IPv4 syncs, with about 80 Services, are slow there);
// a cell whose new flows never show it (127.0.0.1 NodePorts in IPVS
// mode, which neither proxy serves) pays the whole bound.
const newFlowWait = 90 * time.Second

// keepAlive is how often the old flow of a change cell sends while new
// flows wait for the change. The kernel forgets a UDP flow that saw one
// reply 30 s after its last packet (nf_conntrack_udp_timeout): a proxy
// slow to show the change (kube-proxy IPVS in the VM) would otherwise
// have its old flows judged as new ones. In IPVS mode the packet of a
// flow whose real server is gone that still has its conntrack entry is
// dropped once (expire_nodest_conn), the next is scheduled again: in one
// VM run kube-proxy's old NodePort flow after a delete timed out in IPv4
// and was refused in IPv6 by that timing alone.
const keepAlive = 5 * time.Second

// staleClearWait bounds how long a change cell waits for a proxy to
// clear the old flow's entry after the sync that shows the change has
// ended (see afterChange).
const staleClearWait = 10 * time.Second

// The affinity timeout check (Shape.AffinityTimeout): affinityTimeout is
// the Service's timeoutSeconds; each round is affinityBurst probes in
// quick succession (milliseconds apart, far within the timeout), rounds
// are the timeout plus expiryPause apart (a sleep: never shorter), at
// most expiryRounds. With three endpoints and the affinity gone, each
// round after the first lands elsewhere with odds 2/3: all 11 on the
// first round's endpoint has odds 3^-11 (6e-6).
const (
	affinityTimeout = 2
	affinityBurst   = 3
	expiryPause     = 2 * time.Second
	expiryRounds    = 12
	expiryMoves     = "sticky, moves after the timeout"
	expiryStays     = "sticky, stays past the timeout"
)

// expiry runs rounds of probes until a round lands on another endpoint
// than the first (expiryMoves) or expiryRounds have run (expiryStays); a
// round that is not on one endpoint, or a failed probe, ends it.
func (w *World) expiry(ctx context.Context, from *netns.NS, dst netip.AddrPort, c Cell) string {
	first := ""
	for round := range expiryRounds {
		if round > 0 {
			time.Sleep(time.Duration(c.Shape.AffinityTimeout)*time.Second + expiryPause)
		}
		if ctx.Err() != nil {
			return classify(ctx.Err())
		}
		got := ""
		for range affinityBurst {
			r, resent, err := w.send(from, c.proto() == udp, dst, w.timeout)
			switch {
			case err != nil:
				return fmt.Sprintf("round %d: %s", round+1, classify(err))
			case resent:
				return fmt.Sprintf("round %d: %s", round+1, synResent)
			case got != "" && r.Name != got:
				return "not sticky within the timeout"
			}
			got = r.Name
		}
		if first == "" {
			first = got
		} else if got != first {
			return expiryMoves
		}
	}
	return expiryStays
}
