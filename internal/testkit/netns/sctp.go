package netns

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// The standard library has no SCTP. A one-to-one (SOCK_STREAM) SCTP socket
// made with raw syscalls reads and writes like a TCP one, and
// net.FileListener / net.FileConn put it on the runtime's poller (no cgo).

// sctpSocket makes an IPv4 one-to-one SCTP socket as an *os.File.
func sctpSocket(name string) (*os.File, int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP)
	if err != nil {
		return nil, 0, fmt.Errorf("netns: sctp socket (kernel module sctp?): %w", err)
	}
	return os.NewFile(uintptr(fd), name), fd, nil
}

// ServeSCTP starts an IPv4 SCTP echo server on port that answers every
// association with "<pod name> <client address>\n", as Serve does for TCP
// and UDP. It stops with the pod (Stop, or the end of the test).
func (p *Pod) ServeSCTP(port uint16) error {
	var l net.Listener
	err := p.Do(func() error {
		f, fd, err := sctpSocket("sctp-listener")
		if err != nil {
			return err
		}
		defer f.Close()
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
			return fmt.Errorf("SO_REUSEADDR: %w", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(port)}); err != nil {
			return fmt.Errorf("bind: %w", err)
		}
		if err := unix.Listen(fd, 16); err != nil {
			return fmt.Errorf("listen: %w", err)
		}
		l, err = net.FileListener(f)
		return err
	})
	if err != nil {
		return fmt.Errorf("netns: serve sctp %s:%d: %w", p.PodName, port, err)
	}
	p.mu.Lock()
	p.closers = append(p.closers, func() { l.Close() })
	p.mu.Unlock()
	p.echoStream(l)
	return nil
}

// SCTP opens an SCTP association from this namespace to the IPv4 dst and
// reads the echo reply. The connect gives up after timeout (SO_SNDTIMEO).
func (n *NS) SCTP(dst netip.AddrPort, timeout time.Duration) (Reply, error) {
	var c net.Conn
	err := n.Do(func() error {
		f, fd, err := sctpSocket("sctp-client")
		if err != nil {
			return err
		}
		defer f.Close()
		tv := unix.NsecToTimeval(timeout.Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
			return fmt.Errorf("netns: SO_SNDTIMEO: %w", err)
		}
		if err := unix.Connect(fd, &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}); err != nil {
			return fmt.Errorf("netns: sctp connect %s: %w", dst, err)
		}
		c, err = net.FileConn(f)
		return err
	})
	return readReply(c, err, dst, timeout)
}
