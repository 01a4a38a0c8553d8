package ipvs

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/ipset"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// The standard library has no SCTP; a one-to-one (SOCK_STREAM) SCTP
// socket made with a raw syscall reads and writes like a TCP one, and
// net.FileListener / net.FileConn put it on the runtime's poller.

// sctpServe answers every SCTP association on port with "<pod> <peer>\n",
// like netns.Pod.Serve does for TCP and UDP.
func sctpServe(t *testing.T, pod *netns.Pod, port uint16) {
	t.Helper()
	var l net.Listener
	if err := pod.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP)
		if err != nil {
			return fmt.Errorf("sctp socket (module sctp?): %w", err)
		}
		f := os.NewFile(uintptr(fd), "sctp-listener")
		defer f.Close()
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(port)}); err != nil {
			return fmt.Errorf("sctp bind: %w", err)
		}
		if err := unix.Listen(fd, 16); err != nil {
			return fmt.Errorf("sctp listen: %w", err)
		}
		l, err = net.FileListener(f)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	serveConns(t, l, func(c net.Conn) { fmt.Fprintf(c, "%s %s\n", pod.PodName, c.RemoteAddr()) })
}

// sctpDial opens an SCTP association from ns to dst and reads the reply.
func sctpDial(ns *netns.NS, dst netip.AddrPort) (netns.Reply, error) {
	var c net.Conn
	err := ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP)
		if err != nil {
			return fmt.Errorf("sctp socket: %w", err)
		}
		f := os.NewFile(uintptr(fd), "sctp-client")
		defer f.Close()
		tv := unix.NsecToTimeval(timeout.Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
			return err
		}
		if err := unix.Connect(fd, &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}); err != nil {
			return fmt.Errorf("sctp connect %s: %w", dst, err)
		}
		c, err = net.FileConn(f)
		return err
	})
	if err != nil {
		return netns.Reply{}, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return netns.Reply{}, fmt.Errorf("sctp read from %s: %w", dst, err)
	}
	f := strings.Fields(line)
	if len(f) != 2 {
		return netns.Reply{}, fmt.Errorf("sctp: malformed reply %q", line)
	}
	peer, err := netip.ParseAddrPort(f[1])
	if err != nil {
		return netns.Reply{}, fmt.Errorf("sctp: malformed reply %q: %w", line, err)
	}
	return netns.Reply{Name: f[0], Client: peer}, nil
}

// TestSCTP: real SCTP associations through a ClusterIP (from a pod, source
// kept; from outside, masqueraded) and a NodePort (its set is hash:ip,port,
// as kube-proxy's); a service without endpoints makes none.
func TestSCTP(t *testing.T) {
	w := newWorld(t, "a", "c")
	sctpServe(t, w.pods["a"], 9132)
	ep := datapath.Endpoint{Addr: w.pods["a"].AddrPort(9132), Weight: 1, Local: true}
	w.apply(w.p, &datapath.Plan{Full: true, Frontends: []datapath.Frontend{
		{Service: datapath.ServicePortName{Namespace: "default", Name: "sig", Port: "sctp"}, Kind: datapath.ClusterIP, Protocol: datapath.SCTP, Family: datapath.IPv4, Addr: addr("10.96.7.1"), Port: 132,
			Endpoints: []datapath.Endpoint{ep}},
		{Service: datapath.ServicePortName{Namespace: "default", Name: "sig", Port: "sctp"}, Kind: datapath.NodePort, Protocol: datapath.SCTP, Family: datapath.IPv4, Port: 30132,
			Endpoints: []datapath.Endpoint{ep}},
		{Service: datapath.ServicePortName{Namespace: "default", Name: "none", Port: "sctp"}, Kind: datapath.ClusterIP, Protocol: datapath.SCTP, Family: datapath.IPv4, Addr: addr("10.96.7.2"), Port: 132},
	}})
	if r, err := sctpDial(w.pods["c"].NS, ap("10.96.7.1", 132)); err != nil || r.Name != "a" || r.Client.Addr() != w.pods["c"].IP {
		t.Errorf("pod -> SCTP ClusterIP: %v %v, want a seeing %s", r, err, w.pods["c"].IP)
	}
	if r, err := sctpDial(w.client, ap("10.96.7.1", 132)); err != nil || r.Name != "a" {
		t.Errorf("outside client -> SCTP ClusterIP: %v %v, want a", r, err)
	} else if r.Client.Addr() == addr("192.168.77.2") {
		t.Errorf("outside client -> SCTP ClusterIP kept its source %s; want it masqueraded", r.Client)
	}
	np := netip.AddrPortFrom(w.node.LinkIP, 30132)
	if r, err := sctpDial(w.client, np); err != nil || r.Name != "a" {
		t.Errorf("outside client -> SCTP NodePort %s: %v %v, want a", np, err, r)
	} else if r.Client.Addr() == addr("192.168.77.2") {
		t.Errorf("SCTP NodePort with policy Cluster kept the client's source %s", r.Client)
	}
	// Without endpoints: no association. The REJECT's ICMP port
	// unreachable is only a soft error to SCTP (the INIT is retried until
	// the connect times out), as with kube-proxy's endpoint-less virtual
	// servers.
	if r, err := sctpDial(w.pods["c"].NS, ap("10.96.7.2", 132)); err == nil {
		t.Errorf("SCTP service without endpoints: answered by %s, want no association", r.Name)
	}
	k := w.kernel()
	for _, key := range []Key{{addr("10.96.7.1"), datapath.SCTP, 132}, {w.node.LinkIP, datapath.SCTP, 30132}} {
		if v, ok := k[key]; !ok || len(v.Reals) != 1 {
			t.Errorf("kernel: %s: %+v", key, v)
		}
	}
	var entries []string
	if err := w.node.Do(func() error {
		s, es, ok, err := ipset.Netlink{}.Get(setNodePortPfx + "SCTP-HASH")
		if err == nil && (!ok || s.Type != ipset.HashIPPort) {
			err = fmt.Errorf("set %+v exists=%v", s, ok)
		}
		for _, e := range es {
			entries = append(entries, e.String())
		}
		return err
	}); err != nil || !slices.Contains(entries, w.node.LinkIP.String()+",sctp:30132") {
		t.Errorf("SCTP NodePort set: %v, entries %v; want %s,sctp:30132 among them", err, entries, w.node.LinkIP)
	}
}
