// Package netns is the network-namespace test harness: a "node" namespace
// with a bridge, "pod" namespaces wired to it with veth pairs, an optional
// "outside client" namespace, and tiny TCP/UDP (and SCTP, sctp.go) echo
// servers in the pods that answer with their own name and the client
// address they saw.
//
// Everything runs in the test process: code that must run inside a
// namespace does so on a locked OS thread (NS.Do), and sockets keep the
// namespace they were created in. Every object is removed by t.Cleanup,
// also when the test fails. Addresses used (10.244.0.0/24 pods,
// 192.168.77.0/24 node-client link) exist only inside these namespaces.
package netns

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

var seq atomic.Int64

// NS is one network namespace.
type NS struct {
	Name string
	h    netns.NsHandle
	nl   *netlink.Handle
}

var sweepOnce sync.Once

// sweep deletes namespaces this harness left behind in processes that no
// longer exist (a test binary killed before its cleanup ran).
func sweep() {
	entries, err := os.ReadDir("/run/netns")
	if err != nil {
		return
	}
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "ep%d-", &pid); err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue // still running
		}
		_ = netns.DeleteNamed(e.Name())
	}
}

// New creates a named network namespace ("ep<pid>-<n>-<name>", visible to
// `ip netns`) with lo up, removed when t ends. Namespaces left by killed
// test processes are removed on first use.
func New(t testing.TB, name string) *NS {
	t.Helper()
	sweepOnce.Do(sweep)
	full := fmt.Sprintf("ep%d-%d-%s", os.Getpid(), seq.Add(1), name)
	var h netns.NsHandle
	err := onLockedThread(func() error {
		orig, err := netns.Get()
		if err != nil {
			return fmt.Errorf("netns: get current: %w", err)
		}
		defer orig.Close()
		h, err = netns.NewNamed(full)
		if err != nil {
			return fmt.Errorf("netns: create %s: %w", full, err)
		}
		if err := netns.Set(orig); err != nil {
			return errPoisoned{fmt.Errorf("netns: return to original namespace: %w", err)}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	n := &NS{Name: full, h: h}
	t.Cleanup(func() {
		if n.nl != nil {
			n.nl.Close()
		}
		h.Close()
		if err := netns.DeleteNamed(full); err != nil {
			t.Logf("netns: delete %s: %v", full, err)
		}
	})
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatalf("netns: netlink handle in %s: %v", full, err)
	}
	n.nl = nl
	// No duplicate address detection: addresses, link-local ones too, are
	// usable at once instead of a second later.
	for _, k := range []string{"net/ipv6/conf/default/accept_dad", "net/ipv6/conf/all/accept_dad", "net/ipv6/conf/default/dad_transmits"} {
		if err := n.Sysctl(k, "0"); err != nil {
			t.Fatalf("netns: %s: %v", k, err)
		}
	}
	lo, err := nl.LinkByName("lo")
	if err == nil {
		err = nl.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatalf("netns: lo up in %s: %v", full, err)
	}
	return n
}

// Netlink returns a netlink handle bound to the namespace.
func (n *NS) Netlink() *netlink.Handle { return n.nl }

// Handle returns the namespace's file handle.
func (n *NS) Handle() netns.NsHandle { return n.h }

// errPoisoned marks a thread whose namespace could not be restored; it is
// left locked so that the runtime destroys it.
type errPoisoned struct{ error }

func (e errPoisoned) Unwrap() error { return e.error }

func onLockedThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		err := fn()
		var p errPoisoned
		if !errors.As(err, &p) {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// Do runs fn on an OS thread inside the namespace. Sockets opened and
// processes started by fn belong to the namespace.
func (n *NS) Do(fn func() error) error {
	return onLockedThread(func() error {
		orig, err := netns.Get()
		if err != nil {
			return fmt.Errorf("netns: get current: %w", err)
		}
		defer orig.Close()
		if err := netns.Set(n.h); err != nil {
			return fmt.Errorf("netns: enter %s: %w", n.Name, err)
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			return errPoisoned{errors.Join(ferr, fmt.Errorf("netns: leave %s: %w", n.Name, err))}
		}
		return ferr
	})
}

// Run runs a command inside the namespace and returns its combined output.
func (n *NS) Run(name string, args ...string) (string, error) {
	var out []byte
	err := n.Do(func() error {
		var err error
		out, err = exec.Command(name, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
		}
		return nil
	})
	return string(out), err
}

// Sysctl sets a kernel parameter (slash form, e.g. "net/ipv4/ip_forward")
// inside the namespace.
func (n *NS) Sysctl(name, value string) error {
	return n.Do(func() error {
		return os.WriteFile("/proc/sys/"+name, []byte(value), 0o644)
	})
}

// NoTimeWait keeps TCP sockets in the namespace out of TIME_WAIT, for
// worlds that open thousands of connections to a few echo servers. The
// servers close first, so each would hold its side of a connection in
// TIME_WAIT for a minute; a new connection whose tuple meets one (masquerade
// with --random-fully picks ports at random; a client reuses its own ports)
// has its SYN answered for the old connection and sent again after 1 s: a
// stall the proxies did not cause. A fin timeout above TIME_WAIT's minute
// keeps a closed server's FIN_WAIT2 a whole socket until the client's FIN:
// with no TIME_WAIT bucket to turn into it would otherwise go at once, and
// the client's next segment would be answered with a reset.
func (n *NS) NoTimeWait() error {
	for k, v := range map[string]string{"net/ipv4/tcp_max_tw_buckets": "0", "net/ipv4/tcp_fin_timeout": "61"} {
		if err := n.Sysctl(k, v); err != nil {
			return fmt.Errorf("netns: %s: %s: %w", n.Name, k, err)
		}
	}
	return nil
}

// Reply is what an echo server answered.
type Reply struct {
	Name   string         // the pod that answered
	Client netip.AddrPort // the source address the pod saw
	Local  netip.AddrPort // the probe's own address (UDP), also when no answer came
}

func parseReply(s string) (Reply, error) {
	f := strings.Fields(s)
	if len(f) != 2 {
		return Reply{}, fmt.Errorf("netns: malformed echo reply %q", s)
	}
	ap, err := netip.ParseAddrPort(f[1])
	if err != nil {
		return Reply{}, fmt.Errorf("netns: malformed echo reply %q: %w", s, err)
	}
	return Reply{Name: f[0], Client: netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())}, nil
}

// TCP connects from this namespace to dst and reads the echo reply.
func (n *NS) TCP(dst netip.AddrPort, timeout time.Duration) (Reply, error) {
	return n.TCPFrom(dst, 0, timeout)
}

// TCPFrom is TCP from source port srcPort (0: any). A caller that picks
// its own ports can keep a connection's four-tuple from coming back while
// a proxy still remembers it (IPVS drops the first SYN of a reused tuple).
func (n *NS) TCPFrom(dst netip.AddrPort, srcPort uint16, timeout time.Duration) (Reply, error) {
	var c net.Conn
	err := n.Do(func() error {
		var err error
		d := &net.Dialer{Timeout: timeout}
		if srcPort != 0 {
			d.LocalAddr = &net.TCPAddr{Port: int(srcPort)}
		}
		c, err = d.Dial("tcp", dst.String())
		return err
	})
	return readReply(c, err, dst, timeout)
}

// readReply reads the echo reply on the stream c that dial returned with
// err, within timeout, and closes c.
func readReply(c net.Conn, err error, dst netip.AddrPort, timeout time.Duration) (Reply, error) {
	if err != nil {
		return Reply{}, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return Reply{}, fmt.Errorf("netns: read from %s: %w", dst, err)
	}
	return parseReply(line)
}

// UDP sends one datagram from this namespace to dst, from srcPort (0: any),
// and waits for the echo reply. Reply.Local is set even when it fails
// after the socket was made.
func (n *NS) UDP(dst netip.AddrPort, srcPort uint16, timeout time.Duration) (Reply, error) {
	var c *net.UDPConn
	err := n.Do(func() error {
		var err error
		c, err = net.DialUDP("udp", &net.UDPAddr{Port: int(srcPort)}, net.UDPAddrFromAddrPort(dst))
		return err
	})
	if err != nil {
		return Reply{}, err
	}
	defer c.Close()
	local := c.LocalAddr().(*net.UDPAddr).AddrPort()
	local = netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return Reply{Local: local}, fmt.Errorf("netns: send to %s: %w", dst, err)
	}
	buf := make([]byte, 512)
	k, err := c.Read(buf)
	if err != nil {
		return Reply{Local: local}, fmt.Errorf("netns: read from %s (sent from %s): %w", dst, local, err)
	}
	r, err := parseReply(string(buf[:k]))
	r.Local = local
	return r, err
}

// Node is a "node" namespace with a bridge that pods hang off.
type Node struct {
	*NS
	t       testing.TB
	Bridge  string
	Gateway netip.Addr   // the bridge's address, the pods' default gateway
	PodNet  netip.Prefix // pod addresses come from here
	LinkIP  netip.Addr   // the node's address on the client link, once a client exists
	// IPv6: the bridge has Gateway6 (fd00:244::1/64), pods fd00:244::<n>,
	// the client link fd00:77::1 (node) and fd00:77::2 (client).
	Gateway6 netip.Addr
	LinkIP6  netip.Addr
	next     byte
}

// NewNode creates a node namespace with bridge br0 at 10.244.0.1/24 and
// fd00:244::1/64, forwarding on and ICMP redirects off (pods must keep
// sending through the node so that replies are de-NATed).
func NewNode(t testing.TB, name string) *Node {
	t.Helper()
	return NewNodeNets(t, name, netip.MustParsePrefix("10.244.0.0/24"), netip.MustParsePrefix("fd00:244::/64"))
}

// NewNodeNets is NewNode with other pod networks (a /24 and a /64): the
// bridge takes the first address of each, pods the following ones. Use it
// for a second node whose pods are reached by routes.
func NewNodeNets(t testing.TB, name string, podNet, podNet6 netip.Prefix) *Node {
	t.Helper()
	n := &Node{NS: New(t, name), t: t, Bridge: "br0",
		Gateway: podNet.Masked().Addr().Next(), PodNet: podNet.Masked(),
		Gateway6: podNet6.Masked().Addr().Next(), next: 2}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: n.Bridge}}
	if err := n.nl.LinkAdd(br); err != nil {
		t.Fatalf("netns: add bridge: %v", err)
	}
	if err := n.nl.AddrAdd(br, &netlink.Addr{IPNet: ipnet(netip.PrefixFrom(n.Gateway, 24))}); err != nil {
		t.Fatalf("netns: bridge address: %v", err)
	}
	if err := n.nl.AddrAdd(br, &netlink.Addr{IPNet: ipnet(netip.PrefixFrom(n.Gateway6, 64)), Flags: unix.IFA_F_NODAD}); err != nil {
		t.Fatalf("netns: bridge IPv6 address: %v", err)
	}
	if err := n.nl.LinkSetUp(br); err != nil {
		t.Fatalf("netns: bridge up: %v", err)
	}
	for k, v := range map[string]string{
		"net/ipv4/ip_forward":              "1",
		"net/ipv4/conf/all/send_redirects": "0",
		"net/ipv4/conf/br0/send_redirects": "0",
		"net/ipv4/conf/default/rp_filter":  "0",
		"net/ipv4/conf/all/rp_filter":      "0",
		"net/ipv6/conf/all/forwarding":     "1",
	} {
		if err := n.Sysctl(k, v); err != nil {
			t.Fatalf("netns: sysctl %s: %v", k, err)
		}
	}
	return n
}

func ipnet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Pod is a pod namespace with one address.
type Pod struct {
	*NS
	PodName string
	IP      netip.Addr
	IP6     netip.Addr

	mu      sync.Mutex
	closers []func()
	wg      sync.WaitGroup
}

// AddPod creates a pod namespace wired to the node's bridge, with the next
// free pod address as a /32 and a default route through the node.
func (n *Node) AddPod(name string) *Pod {
	n.t.Helper()
	ip := n.PodNet.Addr().As4()
	ip[3] = n.next
	n.next++
	ip6 := n.Gateway6.As16()
	ip6[15] = ip[3]
	return n.AddPodAddrs(name, netip.AddrFrom4(ip), netip.AddrFrom16(ip6))
}

// AddPodAddrs is AddPod with the pod's addresses chosen by the caller. An
// address outside the node's pod networks (a pod whose source is outside
// the cluster CIDR) gets a route to it on the bridge.
func (n *Node) AddPodAddrs(name string, ip, ip6 netip.Addr) *Pod {
	t := n.t
	t.Helper()
	p := &Pod{NS: New(t, name), PodName: name, IP: ip, IP6: ip6}
	host := "v" + fmt.Sprint(ip.As4()[3]) + "-" + name
	if len(host) > 15 {
		host = host[:15]
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: host}, PeerName: "eth0", PeerNamespace: netlink.NsFd(p.h)}
	if err := n.nl.LinkAdd(veth); err != nil {
		t.Fatalf("netns: add veth for %s: %v", name, err)
	}
	hl, err := n.nl.LinkByName(host)
	if err != nil {
		t.Fatalf("netns: %v", err)
	}
	br, err := n.nl.LinkByName(n.Bridge)
	if err != nil {
		t.Fatalf("netns: %v", err)
	}
	if err := n.nl.LinkSetMaster(hl, br); err != nil {
		t.Fatalf("netns: enslave %s: %v", host, err)
	}
	// Hairpin mode, as the CNI bridge plugin sets it: with br_netfilter a
	// pod that reaches itself through a service gets its packet back out of
	// the port it came in on.
	if err := n.nl.LinkSetHairpin(hl, true); err != nil {
		t.Fatalf("netns: hairpin on %s: %v", host, err)
	}
	if err := n.nl.LinkSetUp(hl); err != nil {
		t.Fatalf("netns: %v", err)
	}
	pl, err := p.nl.LinkByName("eth0")
	if err != nil {
		t.Fatalf("netns: %v", err)
	}
	if err := p.nl.AddrAdd(pl, &netlink.Addr{IPNet: ipnet(netip.PrefixFrom(p.IP, 32))}); err != nil {
		t.Fatalf("netns: pod address: %v", err)
	}
	if err := p.nl.LinkSetUp(pl); err != nil {
		t.Fatalf("netns: %v", err)
	}
	gw := ipnet(netip.PrefixFrom(n.Gateway, 32))
	if err := p.nl.RouteAdd(&netlink.Route{LinkIndex: pl.Attrs().Index, Dst: gw, Scope: netlink.SCOPE_LINK}); err != nil {
		t.Fatalf("netns: pod gateway route: %v", err)
	}
	if err := p.nl.RouteAdd(&netlink.Route{LinkIndex: pl.Attrs().Index, Gw: gw.IP}); err != nil {
		t.Fatalf("netns: pod default route: %v", err)
	}
	if err := p.nl.AddrAdd(pl, &netlink.Addr{IPNet: ipnet(netip.PrefixFrom(p.IP6, 128)), Flags: unix.IFA_F_NODAD}); err != nil {
		t.Fatalf("netns: pod IPv6 address: %v", err)
	}
	gw6 := ipnet(netip.PrefixFrom(n.Gateway6, 128))
	if err := p.nl.RouteAdd(&netlink.Route{LinkIndex: pl.Attrs().Index, Dst: gw6, Scope: netlink.SCOPE_LINK}); err != nil {
		t.Fatalf("netns: pod IPv6 gateway route: %v", err)
	}
	if err := p.nl.RouteAdd(&netlink.Route{LinkIndex: pl.Attrs().Index, Gw: gw6.IP, Family: netlink.FAMILY_V6}); err != nil {
		t.Fatalf("netns: pod IPv6 default route: %v", err)
	}
	for _, a := range []netip.Addr{ip, ip6} {
		inside := n.PodNet.Contains(a) || (a.Is6() && netip.PrefixFrom(n.Gateway6, 64).Masked().Contains(a))
		if inside {
			continue
		}
		if err := n.nl.RouteAdd(&netlink.Route{LinkIndex: br.Attrs().Index, Dst: ipnet(netip.PrefixFrom(a, a.BitLen())), Scope: netlink.SCOPE_LINK}); err != nil {
			t.Fatalf("netns: route to %s on the bridge: %v", a, err)
		}
	}
	_ = p.Sysctl("net/ipv4/conf/all/accept_redirects", "0")
	_ = p.Sysctl("net/ipv6/conf/all/accept_redirects", "0")
	t.Cleanup(p.Stop)
	return p
}

// AddClient creates an "outside client" namespace linked to the node by a
// veth pair: node 192.168.77.1/24, client 192.168.77.2/24 with its default
// route through the node. The node's default route points at the client,
// so the node can route (unanswered) traffic to any address.
func (n *Node) AddClient(name string) *NS {
	t := n.t
	t.Helper()
	c := New(t, name)
	nodeIP, clientIP := netip.MustParseAddr("192.168.77.1"), netip.MustParseAddr("192.168.77.2")
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "c-" + name}, PeerName: "eth0", PeerNamespace: netlink.NsFd(c.h)}
	if len(veth.Name) > 15 {
		veth.Name = veth.Name[:15]
	}
	if err := n.nl.LinkAdd(veth); err != nil {
		t.Fatalf("netns: add client veth: %v", err)
	}
	hl, err := n.nl.LinkByName(veth.Name)
	if err != nil {
		t.Fatalf("netns: %v", err)
	}
	if err := n.nl.AddrAdd(hl, &netlink.Addr{IPNet: ipnet(netip.PrefixFrom(nodeIP, 24))}); err != nil {
		t.Fatalf("netns: %v", err)
	}
	if err := n.nl.LinkSetUp(hl); err != nil {
		t.Fatalf("netns: %v", err)
	}
	cl, err := c.nl.LinkByName("eth0")
	if err != nil {
		t.Fatalf("netns: %v", err)
	}
	if err := c.nl.AddrAdd(cl, &netlink.Addr{IPNet: ipnet(netip.PrefixFrom(clientIP, 24))}); err != nil {
		t.Fatalf("netns: %v", err)
	}
	if err := c.nl.LinkSetUp(cl); err != nil {
		t.Fatalf("netns: %v", err)
	}
	if err := c.nl.RouteAdd(&netlink.Route{LinkIndex: cl.Attrs().Index, Gw: nodeIP.AsSlice()}); err != nil {
		t.Fatalf("netns: client default route: %v", err)
	}
	if err := n.nl.RouteAdd(&netlink.Route{LinkIndex: hl.Attrs().Index, Gw: clientIP.AsSlice()}); err != nil {
		t.Fatalf("netns: node default route: %v", err)
	}
	n.LinkIP = nodeIP
	nodeIP6, clientIP6 := netip.MustParseAddr("fd00:77::1"), netip.MustParseAddr("fd00:77::2")
	if err := n.nl.AddrAdd(hl, &netlink.Addr{IPNet: ipnet(netip.PrefixFrom(nodeIP6, 64)), Flags: unix.IFA_F_NODAD}); err != nil {
		t.Fatalf("netns: %v", err)
	}
	if err := c.nl.AddrAdd(cl, &netlink.Addr{IPNet: ipnet(netip.PrefixFrom(clientIP6, 64)), Flags: unix.IFA_F_NODAD}); err != nil {
		t.Fatalf("netns: %v", err)
	}
	if err := c.nl.RouteAdd(&netlink.Route{LinkIndex: cl.Attrs().Index, Gw: nodeIP6.AsSlice(), Family: netlink.FAMILY_V6}); err != nil {
		t.Fatalf("netns: client IPv6 default route: %v", err)
	}
	if err := n.nl.RouteAdd(&netlink.Route{LinkIndex: hl.Attrs().Index, Gw: clientIP6.AsSlice(), Family: netlink.FAMILY_V6}); err != nil {
		t.Fatalf("netns: node IPv6 default route: %v", err)
	}
	n.LinkIP6 = nodeIP6
	return c
}

// Serve starts TCP and UDP echo servers on port (both protocols, same
// port). Each answers "<pod name> <client address>\n". They stop with the
// pod (Stop, or the end of the test).
func (p *Pod) Serve(port uint16) error {
	var ls []net.Listener
	var pcs []net.PacketConn
	err := p.Do(func() error {
		for _, nw := range []string{"tcp4", "tcp6"} {
			l, err := net.Listen(nw, fmt.Sprintf(":%d", port))
			if err != nil {
				return err
			}
			ls = append(ls, l)
		}
		for _, nw := range []string{"udp4", "udp6"} {
			c, err := net.ListenPacket(nw, fmt.Sprintf(":%d", port))
			if err != nil {
				return err
			}
			pcs = append(pcs, c)
		}
		return nil
	})
	p.mu.Lock()
	for _, l := range ls {
		p.closers = append(p.closers, func() { l.Close() })
	}
	for _, c := range pcs {
		p.closers = append(p.closers, func() { c.Close() })
	}
	p.mu.Unlock()
	if err != nil {
		p.Stop()
		return fmt.Errorf("netns: serve %s:%d: %w", p.PodName, port, err)
	}
	for _, l := range ls {
		p.echoStream(l)
	}
	for _, c := range pcs {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			buf := make([]byte, 512)
			for {
				_, from, err := c.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = c.WriteTo(fmt.Appendf(nil, "%s %s\n", p.PodName, from), from)
			}
		}()
	}
	return nil
}

// echoStream answers every connection l accepts with "<pod name> <client
// address>\n" until l is closed (Stop closes it and waits).
func (p *Pod) echoStream(l net.Listener) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s %s\n", p.PodName, c.RemoteAddr())
			c.Close()
		}
	}()
}

// Stop closes the pod's servers and waits for them.
func (p *Pod) Stop() {
	p.mu.Lock()
	cs := p.closers
	p.closers = nil
	p.mu.Unlock()
	for _, c := range cs {
		c()
	}
	p.wg.Wait()
}

// AddrPort returns the pod's IPv4 address with port.
func (p *Pod) AddrPort(port uint16) netip.AddrPort { return netip.AddrPortFrom(p.IP, port) }

// AddrPort6 returns the pod's IPv6 address with port.
func (p *Pod) AddrPort6(port uint16) netip.AddrPort { return netip.AddrPortFrom(p.IP6, port) }

// LinkHost wires the node to the namespace the test runs in (the "host")
// with a veth pair, so that a process in the node, such as the agent, can
// reach a server the test runs, such as kube-apiserver. Each pair gets its
// own 192.168.250.x/30, named by it; the link goes when the test ends.
// Test binaries of several packages run at once: a slot another one
// holds (its link's name exists) is passed over for the next.
func (n *Node) LinkHost() (host, node netip.Addr) {
	t := n.t
	t.Helper()
	hostNL, err := netlink.NewHandle()
	if err != nil {
		t.Fatalf("netns: netlink handle: %v", err)
	}
	defer hostNL.Close()
	first := (os.Getpid() + int(seq.Add(1))) % 63
	var name string
	for i := range 63 {
		k := (first + i) % 63
		name = fmt.Sprintf("ephost%d", 4*k)
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: "host0", PeerNamespace: netlink.NsFd(n.h)}
		err = hostNL.LinkAdd(veth)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		if err != nil {
			t.Fatalf("netns: add host veth: %v", err)
		}
		host = netip.AddrFrom4([4]byte{192, 168, 250, byte(4*k + 1)})
		node = netip.AddrFrom4([4]byte{192, 168, 250, byte(4*k + 2)})
		break
	}
	if !host.IsValid() {
		t.Fatalf("netns: add host veth: all 63 slots taken: %v", err)
	}
	t.Cleanup(func() {
		h, err := netlink.NewHandle()
		if err != nil {
			return
		}
		defer h.Close()
		if l, err := h.LinkByName(name); err == nil {
			_ = h.LinkDel(l)
		}
	})
	hl, err := hostNL.LinkByName(name)
	if err != nil {
		t.Fatalf("netns: %v", err)
	}
	if err := hostNL.AddrAdd(hl, &netlink.Addr{IPNet: ipnet(netip.PrefixFrom(host, 30))}); err != nil {
		t.Fatalf("netns: host veth address: %v", err)
	}
	if err := hostNL.LinkSetUp(hl); err != nil {
		t.Fatalf("netns: %v", err)
	}
	nl, err := n.nl.LinkByName("host0")
	if err != nil {
		t.Fatalf("netns: %v", err)
	}
	if err := n.nl.AddrAdd(nl, &netlink.Addr{IPNet: ipnet(netip.PrefixFrom(node, 30))}); err != nil {
		t.Fatalf("netns: node host-link address: %v", err)
	}
	if err := n.nl.LinkSetUp(nl); err != nil {
		t.Fatalf("netns: %v", err)
	}
	return host, node
}

// Start starts cmd inside the namespace. When t ends the process is
// killed by its PID and waited for.
func (n *NS) Start(t testing.TB, cmd *exec.Cmd) error {
	t.Helper()
	if err := n.Do(cmd.Start); err != nil {
		return fmt.Errorf("netns: start %s in %s: %w", cmd.Path, n.Name, err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return nil
}
