package conformance

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
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
	}
	panic("conformance: unknown position " + position)
}

// target is the address:port a cell sends to.
func (w *World) target(c Cell) (netip.AddrPort, error) {
	svc := w.Services[c.Shape.Name]
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
// server closed first. The range is below the ephemeral ports (32768+),
// the NodePorts (30000+) and the stale-conntrack flows (40000+), and above
// the ports the proxies listen on (10249, 10256).
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
	if c.Frontend == FHostPortCIP || c.Frontend == FHostPortLB {
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

// staleFlow is an established UDP flow of a stale-conntrack cell.
type staleFlow struct {
	cell    Cell
	dst     netip.AddrPort
	port    uint16 // the client's source port, kept across the change
	before  string
	outcome string
}

// Stale runs the stale-conntrack cells of one proxy run: each cell opens a
// UDP flow from a fixed source port to the Service (answered by sa); sa
// is replaced by sb; once a new flow reaches sb, the old flow sends again.
// Upstream clears the old flow's conntrack entry, so it reaches sb too.
// The world is put back (sa) before it returns.
func (w *World) Stale(ctx context.Context, cells []Cell) map[string]Outcome {
	out := map[string]Outcome{}
	var flows []*staleFlow
	for i, c := range cells {
		dst, err := w.target(c)
		if err != nil {
			out[c.Key()] = Outcome{Text: "harness: " + err.Error()}
			continue
		}
		f := &staleFlow{cell: c, dst: dst, port: uint16(40000 + i)}
		r, err := w.client(c.Position).UDP(dst, f.port, w.timeout)
		if err != nil {
			f.before = classify(err)
		} else {
			f.before = r.Name
		}
		flows = append(flows, f)
	}
	shape := cells[0].Shape.Name
	if err := w.relabel(ctx, shape, "sa", "sb"); err != nil {
		for _, f := range flows {
			out[f.cell.Key()] = Outcome{Text: "harness: " + err.Error()}
		}
		return out
	}
	for _, f := range flows {
		from := w.client(f.cell.Position)
		// Wait (bounded) until the proxy has the new endpoint: a new
		// flow, from another source port, reaches sb.
		deadline := time.Now().Add(30 * time.Second)
		seen := ""
		for time.Now().Before(deadline) && ctx.Err() == nil {
			r, err := from.UDP(f.dst, 0, w.timeout)
			if err == nil && r.Name == "sb" {
				seen = "sb"
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if seen == "" {
			f.outcome = "before " + f.before + ", new flows never reach sb"
			continue
		}
	}
	// A proxy clears conntrack after it writes the rules, and on a loaded
	// machine that can take a while: the old flow is asked (bounded) until
	// it reaches sb. A proxy that never clears keeps answering sa, so the
	// outcome is the same however long the wait; only a slow clear stops
	// looking like a missing one.
	for _, f := range flows {
		if f.outcome == "" {
			f.outcome = "before " + f.before + ", old flow after replace: " + w.oldFlow(ctx, f)
		}
		out[f.cell.Key()] = Outcome{Text: f.outcome}
	}
	if err := w.relabel(ctx, shape, "sb", "sa"); err != nil {
		w.t.Errorf("put stale-conntrack service back: %v", err)
	}
	return out
}

// oldFlow sends on a stale-conntrack cell's original flow until it reaches
// sb or staleClearWait passes, and says where its last packet went.
func (w *World) oldFlow(ctx context.Context, f *staleFlow) string {
	deadline := time.Now().Add(staleClearWait)
	for {
		r, err := w.client(f.cell.Position).UDP(f.dst, f.port, w.timeout)
		after := ""
		if err != nil {
			after = classify(err)
		} else {
			after = r.Name
		}
		if after == "sb" || !time.Now().Before(deadline) || ctx.Err() != nil {
			return after
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// staleClearWait bounds how long a stale-conntrack cell waits for a proxy
// to clear the old flow's entry after new flows reach the new endpoint.
const staleClearWait = 10 * time.Second
