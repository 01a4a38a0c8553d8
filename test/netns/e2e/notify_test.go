package e2e_test

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/test/agenttest"
)

// wedgeableRestore puts iptables-restore and ip6tables-restore wrappers in
// a directory for the front of the agent's PATH: they run the real tools,
// except while the file wedge exists, when they hang (at most 5 minutes)
// the way iptables-restore does behind a stuck xtables lock holder.
func wedgeableRestore(t *testing.T) (binDir, wedge string) {
	t.Helper()
	binDir, wedge = t.TempDir(), filepath.Join(t.TempDir(), "wedge")
	for _, name := range []string{"iptables-restore", "ip6tables-restore"} {
		real, err := exec.LookPath(name)
		if err != nil {
			t.Fatal(err)
		}
		script := fmt.Sprintf("#!/bin/sh\ni=0\nwhile [ -e %q ] && [ $i -lt 3000 ]; do sleep 0.1; i=$((i+1)); done\nexec %q \"$@\"\n", wedge, real)
		if err := os.WriteFile(filepath.Join(binDir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return binDir, wedge
}

// The notify protocol with the iptables datapath in a node namespace:
// READY=1 arrives when the kernel is programmed (the ClusterIP answers at
// the first try), watchdog pings flow while the sync loop turns, stop while
// it is wedged in iptables-restore, and resume once it is unwedged.
func TestIPTablesNotifyWatchdog(t *testing.T) {
	bin := rootAgent(t, "iptables", "iptables-restore", "ip6tables-restore", "sh")
	got := agenttest.ListenNotify(t)
	binDir, wedge := wedgeableRestore(t)

	node := netns.NewNode(t, "node")
	a, b := node.AddPod("a"), node.AddPod("b")
	serve(t, a, b)
	m := newManifestsAgent(t)
	web := m.manifest(t, "web.yaml", webManifest(a.IP, nodeName))
	m.writeConfig(t, "clusterCIDR: 10.244.0.0/16\nsync: {minPeriod: 100ms, period: 300ms}\n")
	logPath := m.log
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = os.Remove(wedge) // let a hung wrapper finish
		logf.Close()
		if t.Failed() {
			out, _ := os.ReadFile(logPath)
			t.Logf("agent log:\n%s", out)
		}
	})
	agentLog := func() string { b, _ := os.ReadFile(logPath); return string(b) }

	cmd := exec.Command(bin, "run", "--config", m.cfg)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(append(os.Environ(), "PATH="+binDir+":"+os.Getenv("PATH")), got.Env()...)
	if err := node.Start(t, cmd); err != nil {
		t.Fatal(err)
	}

	vip := netip.AddrPortFrom(netip.MustParseAddr("10.96.100.10"), 80)
	waitFor(t, 60*time.Second, "READY=1", func() error {
		if got.Count(0, "READY=1") == 0 {
			return errors.New("not yet")
		}
		return nil
	})
	// READY=1 promises programmed rules: the first connection is answered.
	if r, err := b.TCP(vip, 2*time.Second); err != nil || r.Name != "a" {
		t.Fatalf("first connection after READY=1: %+v %v", r, err)
	}
	mark := len(got.All())
	waitFor(t, 15*time.Second, "watchdog pings while syncing", func() error {
		if n := got.Count(mark, "WATCHDOG=1"); n < 4 {
			return fmt.Errorf("%d pings", n)
		}
		return nil
	})

	// Wedge the sync loop inside iptables-restore (a periodic sync with
	// nothing to change does not run it; moving the endpoint to pod b
	// does): the pings stop, and the agent says why.
	// Only what the agent logs from now on counts: a slow sync before
	// (the first periodic full check, on a loaded machine) may have
	// withheld pings for a moment already.
	logMark := len(agentLog())
	if err := os.WriteFile(wedge, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	writeFile(t, web, webManifest(b.IP, nodeName))
	waitFor(t, 15*time.Second, "agent withholds pings", func() error {
		if !strings.Contains(agentLog()[logMark:], "withholding watchdog pings") {
			return errors.New("not yet")
		}
		return nil
	})
	stopped := len(got.All())
	time.Sleep(2500 * time.Millisecond) // five ping intervals
	if n := got.Count(stopped, "WATCHDOG=1"); n != 0 {
		t.Fatalf("%d watchdog pings while the sync loop was wedged", n)
	}

	// The old rules stay in force while the loop hangs.
	if r, err := b.TCP(vip, 2*time.Second); err != nil || r.Name != "a" {
		t.Errorf("ClusterIP while wedged: %+v %v, want the old endpoint a", r, err)
	}

	// Unwedged, the loop turns again, the pings resume and the change
	// lands.
	if err := os.Remove(wedge); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "pings resume", func() error {
		if n := got.Count(stopped, "WATCHDOG=1"); n < 3 {
			return fmt.Errorf("%d pings", n)
		}
		return nil
	})
	if !strings.Contains(agentLog()[logMark:], "resuming watchdog pings") {
		t.Errorf("the agent log does not say the pings resumed")
	}
	waitFor(t, 15*time.Second, "ClusterIP answered by b after the wedge", func() error {
		r, err := a.TCP(vip, time.Second)
		if err == nil && r.Name != "b" {
			err = fmt.Errorf("answered by %s", r.Name)
		}
		return err
	})
	if n := got.Count(0, "READY=1"); n != 1 {
		t.Errorf("READY=1 sent %d times, want once", n)
	}
}
