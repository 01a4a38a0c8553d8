package e2e_test

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// killRestartUnderStream SIGKILLs the agent while client opens a bounded
// stream of connections to dst, starts it again (the test's cleanup stops
// it), and fails t if any connection failed across the kill and restart.
func killRestartUnderStream(t *testing.T, node *netns.Node, client *netns.NS, dst netip.AddrPort, ag *agent, bin, cfg, logPath string) {
	t.Helper()
	underStream(t, client, dst, "SIGKILL and restart", func() {
		ag.kill(t)
		startAgent(t, node, bin, cfg, logPath)
		waitFor(t, 60*time.Second, "restarted agent healthy (healthz 200)", func() error { return healthz(node) })
	})
}

// underStream opens a bounded stream of connections from client to dst,
// runs disrupt once 20 have succeeded, waits for 50 more, and fails t if
// any connection failed. It returns how many succeeded.
func underStream(t *testing.T, client *netns.NS, dst netip.AddrPort, what string, disrupt func()) int64 {
	t.Helper()
	s := startStream(client, dst, 0, 100000, 3*time.Minute)
	defer s.stop() // also when disrupt fails t
	for s.ok.Load() < 20 && s.failed.Load() == 0 {
		time.Sleep(20 * time.Millisecond)
	}
	disrupt()
	mid := s.ok.Load()
	for s.ok.Load() < mid+50 && s.failed.Load() == 0 {
		time.Sleep(20 * time.Millisecond)
	}
	if s.failed.Load() != 0 {
		t.Fatalf("%d of %d connections failed across %s: %v", s.failed.Load(), s.ok.Load()+s.failed.Load(), what, s.firstErr.Load())
	}
	t.Logf("%d connections across %s, none failed", s.ok.Load(), what)
	return s.ok.Load()
}

// waitRefused waits until dst refuses connections from client.
func waitRefused(t *testing.T, client *netns.NS, dst netip.AddrPort, what string) {
	t.Helper()
	waitFor(t, 30*time.Second, what, func() error {
		_, err := client.TCP(dst, time.Second)
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil
		}
		return fmt.Errorf("still %v", err)
	})
}
