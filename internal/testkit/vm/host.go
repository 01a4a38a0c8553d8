package vm

import (
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// HostAddr is the host as the guest sees it on qemu's user network: a
// port the host listens on at its loopback is reached here.
const HostAddr = "10.0.2.2"

// CopyBinary copies the executable from to to (mode 0755), for a binary
// the guest must run: one built under the host's /tmp is not visible
// there (the guest has its own /tmp), one copied into the shared
// directory is.
func CopyBinary(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", from, err)
	}
	return out.Close()
}

// RelayToHost relays 127.0.0.1:port in ns (nil: the caller's own
// namespace) to the host's port at HostAddr, for a guest process that
// must reach a server on the host's loopback by a name that says
// 127.0.0.1 (a kubeconfig written on the host). The relay and every
// connection through it end with the test.
func RelayToHost(t testing.TB, ns *netns.NS, port int) {
	t.Helper()
	relay(t, ns, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), net.JoinHostPort(HostAddr, strconv.Itoa(port)))
}

// relay listens on addr in ns (nil: the caller's namespace) and relays
// each connection to upstream until the test ends. It returns the address
// it listens on.
func relay(t testing.TB, ns *netns.NS, addr, upstream string) net.Addr {
	t.Helper()
	var l net.Listener
	listen := func() (err error) {
		l, err = net.Listen("tcp", addr)
		return err
	}
	var err error
	if ns != nil {
		err = ns.Do(listen)
	} else {
		err = listen()
	}
	if err != nil {
		t.Fatalf("relay to %s: %v", upstream, err)
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		conns  = map[net.Conn]bool{}
		closed bool
	)
	// track adds c to the open connections (closing it at once once the
	// test has ended) or removes it.
	track := func(c net.Conn, on bool) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case on && closed:
			c.Close()
		case on:
			conns[c] = true
		default:
			delete(conns, c)
		}
	}
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		closed = true
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer in.Close()
				out, err := net.DialTimeout("tcp", upstream, 10*time.Second)
				if err != nil {
					return
				}
				defer out.Close()
				track(in, true)
				track(out, true)
				defer track(in, false)
				defer track(out, false)
				done := make(chan struct{})
				go func() {
					_, _ = io.Copy(out, in)
					out.Close()
					close(done)
				}()
				_, _ = io.Copy(in, out)
				in.Close()
				<-done
			}()
		}
	}()
	return l.Addr()
}
