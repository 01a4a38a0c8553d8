package agenttest

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// NotifySocket is the systemd side of the notify protocol: a unixgram
// socket in t.TempDir() that records every datagram the agent sends.
type NotifySocket struct {
	// Path is the socket's path, the agent's NOTIFY_SOCKET.
	Path string
	mu   sync.Mutex
	msgs []string // one entry per datagram, in arrival order
	wake chan struct{}
}

// ListenNotify opens a NotifySocket; it is closed when t ends, and its
// datagrams are printed if t failed.
func ListenNotify(t testing.TB) *NotifySocket {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatalf("notify socket: %v", err)
	}
	s := &NotifySocket{Path: path, wake: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() { // ends when the socket is closed at cleanup
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.msgs = append(s.msgs, string(buf[:n]))
			s.mu.Unlock()
			select {
			case s.wake <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		conn.Close()
		<-done
		if t.Failed() {
			t.Logf("notify datagrams:\n%s", strings.Join(s.All(), "\n--\n"))
		}
	})
	return s
}

// Env is what systemd gives a Type=notify unit with WatchdogSec=1s.
func (s *NotifySocket) Env() []string {
	return []string{"NOTIFY_SOCKET=" + s.Path, "WATCHDOG_USEC=1000000"}
}

// All returns the datagrams received so far.
func (s *NotifySocket) All() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.msgs...)
}

// Count returns how many datagrams from index from on carry line.
func (s *NotifySocket) Count(from int, line string) int {
	n := 0
	for _, m := range s.All()[from:] {
		for _, l := range strings.Split(m, "\n") {
			if l == line {
				n++
			}
		}
	}
	return n
}

// Index returns the index of the first datagram at or after from with a
// line starting with prefix, or -1.
func (s *NotifySocket) Index(from int, prefix string) int {
	msgs := s.All()
	for i := from; i < len(msgs); i++ {
		for _, l := range strings.Split(msgs[i], "\n") {
			if strings.HasPrefix(l, prefix) {
				return i
			}
		}
	}
	return -1
}

// WaitFor waits until cond holds for the datagrams, bounded by timeout
// (a bound against a broken agent, not a performance assertion).
func (s *NotifySocket) WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(timeout)
	for !cond() {
		select {
		case <-s.wake:
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatalf("notify: %s: not within %s", what, timeout)
		}
	}
}

// WaitPings waits for n more WATCHDOG=1 pings after datagram index from.
func (s *NotifySocket) WaitPings(t testing.TB, from, n int, timeout time.Duration) {
	t.Helper()
	s.WaitFor(t, timeout, fmt.Sprintf("%d watchdog pings", n), func() bool {
		return s.Count(from, "WATCHDOG=1") >= n
	})
}
