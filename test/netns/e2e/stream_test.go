package e2e_test

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
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
		if err := ag.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = ag.cmd.Wait()
		startAgent(t, node, bin, cfg, logPath)
		waitFor(t, 60*time.Second, "restarted agent healthy (healthz 200)", func() error { return healthz(node) })
	})
}

// underStream opens a bounded stream of connections from client to dst,
// runs disrupt once 20 have succeeded, waits for 50 more, and fails t if
// any connection failed. It returns how many succeeded.
func underStream(t *testing.T, client *netns.NS, dst netip.AddrPort, what string, disrupt func()) int64 {
	t.Helper()
	var okN, failN atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		deadline := time.Now().Add(3 * time.Minute)
		for i := 0; i < 100000 && time.Now().Before(deadline); i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := client.TCP(dst, 2*time.Second); err != nil {
				failN.Add(1)
				firstErr.CompareAndSwap(nil, err)
			} else {
				okN.Add(1)
			}
		}
	}()
	defer func() { // also when disrupt fails t
		close(stop)
		wg.Wait()
	}()
	for okN.Load() < 20 && failN.Load() == 0 {
		time.Sleep(20 * time.Millisecond)
	}
	disrupt()
	mid := okN.Load()
	for okN.Load() < mid+50 && failN.Load() == 0 {
		time.Sleep(20 * time.Millisecond)
	}
	if failN.Load() != 0 {
		t.Fatalf("%d of %d connections failed across %s: %v", failN.Load(), okN.Load()+failN.Load(), what, firstErr.Load())
	}
	t.Logf("%d connections across %s, none failed", okN.Load(), what)
	return okN.Load()
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
