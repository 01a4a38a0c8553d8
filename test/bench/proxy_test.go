package bench

import (
	"io"
	"math"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// startShell runs script under sh with a pipe as its stdin; the shell is
// waited for when t ends, after its stdin is closed.
func startShell(t *testing.T, script string) (*exec.Cmd, io.WriteCloser) {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	return cmd, stdin
}

// Wakeups counts the voluntary context switches of every thread: a child
// that sleeps in a loop is seen waking up, one per sleep at least.
func TestWakeups(t *testing.T) {
	cmd, _ := startShell(t, "for i in 1 2 3 4 5; do sleep 0.01; done; read x")
	w0, err := Wakeups(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	var w1 int64
	for range 100 { // the shell waits on five sleeps, then on stdin
		time.Sleep(20 * time.Millisecond)
		if w1, err = Wakeups(cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
		if w1-w0 >= 5 {
			break
		}
	}
	if w1-w0 < 5 {
		t.Fatalf("wakeups went from %d to %d, want at least 5 more", w0, w1)
	}
	if _, err := Wakeups(1 << 30); err == nil {
		t.Fatal("no error for a process that does not exist")
	}
}

// Run counts CPU to the nanosecond: a process that spins for a few
// milliseconds moves it by about that much, where CPU (clock ticks) may
// not move at all; a sleeping one moves it by almost nothing.
func TestUsageRun(t *testing.T) {
	cmd, stdin := startShell(t, "read x; i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; read x")
	time.Sleep(50 * time.Millisecond)
	u0, err := ReadUsage(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	u1, err := ReadUsage(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if d := u1.Run - u0.Run; d < 0 || d > 5*time.Millisecond {
		t.Errorf("a process blocked on read ran %s", d)
	}
	if u0.Run <= 0 {
		t.Errorf("a started shell has run %s", u0.Run)
	}
	if _, err := stdin.Write([]byte("\n")); err != nil {
		t.Fatal(err)
	}
	// The loop spins, then the shell blocks on the second read: wait until
	// Run stops moving (bounded), and it has moved by the loop's work.
	var u2 Usage
	for range 200 {
		time.Sleep(25 * time.Millisecond)
		if u2, err = ReadUsage(cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
		if u3, _ := ReadUsage(cmd.Process.Pid); u2.Run > u1.Run+time.Millisecond && u3.Run == u2.Run {
			break
		}
	}
	if d := u2.Run - u1.Run; d < time.Millisecond {
		t.Errorf("a shell counting to 20000 ran %s", d)
	}
	if u2.Run < u2.CPU-10*time.Millisecond || u2.Run > u2.CPU+20*time.Millisecond {
		t.Errorf("Run %s and CPU %s differ by more than a clock tick", u2.Run, u2.CPU)
	}
}

// A resource use of zero is a measured value: it meets any target, and a
// target of zero is missed by any use.
func TestVerdictUse(t *testing.T) {
	for _, c := range []struct {
		v, target float64
		want      string
	}{{0, 0.05, "met"}, {0, 0, "met"}, {0.04, 0.05, "met"}, {0.1, 0.05, "missed by 100%"}, {0.01, 0, "missed (none allowed)"}, {math.NaN(), 1, "–"}} {
		if got := verdictUse(c.v, c.target); got != c.want {
			t.Errorf("verdictUse(%v, %v) = %q, want %q", c.v, c.target, got, c.want)
		}
	}
}

// S5's target in the report: nftables mode against kube-proxy's nftables
// mode is held to issue 27's 0.4×, edgeproxy in iptables mode to 0.5×.
func TestS5Target(t *testing.T) {
	const mib = 1 << 20
	rep := &Report{
		Plan: Plan{Sizes: []int{5000}, Backends: []string{"nft"}, Proxies: []ProxyKind{EdgeProxy, EdgeProxyNFT, KubeProxyNFT}},
		Results: []Result{
			{Proxy: KubeProxyNFT, Backend: "nft", Services: 5000, QuietWindow: 22, SteadyRSS: 100 * mib},
			{Proxy: EdgeProxyNFT, Backend: "nft", Services: 5000, QuietWindow: 22, SteadyRSS: 45 * mib},
			{Proxy: EdgeProxy, Backend: "nft", Services: 5000, QuietWindow: 22, SteadyRSS: 45 * mib},
		},
	}
	var b strings.Builder
	rep.Markdown(&b, nil)
	out := b.String()
	if !strings.Contains(out, "target RSS ≤0.5 (edgeproxy-nftables 0.4)× kube-proxy-nftables |") {
		t.Errorf("S5 header names the wrong targets:\n%s", out)
	}
	for kind, want := range map[ProxyKind]string{EdgeProxyNFT: "missed by 12%", EdgeProxy: "met"} {
		row := ""
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "| 5000 | "+string(kind)+" | 22.00 s |") {
				row = l
			}
		}
		if !strings.HasSuffix(row, "| "+want+" |") {
			t.Errorf("S5 row of %s = %q, want the RSS verdict %q", kind, row, want)
		}
	}
}
