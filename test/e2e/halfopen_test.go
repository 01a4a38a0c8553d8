package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/edgeproxy/edgeproxy/test/agenttest"
	"github.com/edgeproxy/edgeproxy/test/cluster"
)

// relayEnv, when set in the environment of the test binary, turns the
// process into a plain TCP relay ("LISTEN->TARGET") before any test runs:
// the half-open test re-executes itself this way to get a relay it can
// freeze with SIGSTOP.
const relayEnv = "EDGEPROXY_E2E_RELAY"

func init() {
	if spec := os.Getenv(relayEnv); spec != "" {
		if err := runRelay(spec); err != nil {
			fmt.Fprintln(os.Stderr, "relay:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// runRelay listens, prints its address on stdout and forwards every
// connection to the target until it is killed.
func runRelay(spec string) error {
	listen, target, ok := strings.Cut(spec, "->")
	if !ok {
		return fmt.Errorf("%s=%q: want LISTEN->TARGET", relayEnv, spec)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	fmt.Println(ln.Addr())
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() { // ends when either side closes
			defer c.Close()
			u, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				return
			}
			defer u.Close()
			pipe(c, u)
		}()
	}
}

// pipe copies both ways until one direction ends, then closes both.
func pipe(a, b net.Conn) {
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(a, b); done <- struct{}{} }()
	go func() { _, _ = io.Copy(b, a); done <- struct{}{} }()
	<-done
	a.Close()
	b.Close()
	<-done
}

// front is the address the agent dials. It sends each new connection
// through the relay process while viaRelay is set, straight to the API
// server otherwise, and counts both.
type front struct {
	ln               net.Listener
	relay, apiserver string
	viaRelay         atomic.Bool
	relayed, direct  atomic.Int64
	mu               sync.Mutex
	conns            []net.Conn
	wg               sync.WaitGroup
}

func startFront(t *testing.T, relay, apiserver string) *front {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &front{ln: ln, relay: relay, apiserver: apiserver}
	f.viaRelay.Store(true)
	f.wg.Add(1)
	go func() { // ends when ln is closed at cleanup
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			target := f.apiserver
			if f.viaRelay.Load() {
				target = f.relay
				f.relayed.Add(1)
			} else {
				f.direct.Add(1)
			}
			u, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				c.Close()
				continue
			}
			f.mu.Lock()
			f.conns = append(f.conns, c, u)
			f.mu.Unlock()
			f.wg.Add(1)
			go func() { defer f.wg.Done(); pipe(c, u) }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		f.mu.Lock()
		for _, c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
		f.wg.Wait()
	})
	return f
}

// startRelay re-executes the test binary as a relay to target and returns
// its process and address; it is killed by PID when t ends.
func startRelay(t *testing.T, target string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), relayEnv+"=127.0.0.1:0->"+target)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start relay: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // SIGKILL ends a stopped process too
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("relay address: %v", err)
	}
	return cmd, strings.TrimSpace(line)
}

// The API connection goes half-open: the relay it runs through is frozen
// with SIGSTOP, so TCP stays up and nothing flows. The agent must notice
// (client-go's HTTP/2 health check: a PING after 30 s without frames,
// dropped after 15 s without its answer), dial again, and see a Service
// created meanwhile — within a minute, not after the 15 minutes TCP
// retransmission would take.
func TestHalfOpenAPIConnection(t *testing.T) {
	c := cluster.New(t, cluster.Options{})
	ctx := ctxFor(t)
	if err := c.CreateNamespace(ctx, "ho"); err != nil {
		t.Fatal(err)
	}
	api := strings.TrimPrefix(c.URL, "https://")
	relay, relayAddr := startRelay(t, api)
	f := startFront(t, relayAddr, api)

	// The certificate covers 127.0.0.1 at any port.
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := c.WriteKubeconfig(kc, "https://"+f.ln.Addr().String()); err != nil {
		t.Fatal(err)
	}
	p80 := []corev1.ServicePort{tcp("", 80, intstr.FromInt32(8080))}
	create(t, c.Client(), service("ho", "before", "10.96.8.10", p80))
	a := agentWithKubeconfig(t, kc, "ho-a")
	a.WaitPlanLines(converge, []string{"TCP  10.96.8.10:80 ClusterIP ho/before -> (none)"})
	if f.relayed.Load() == 0 || f.direct.Load() != 0 {
		t.Fatalf("agent connections: %d through the relay, %d direct; want all through the relay", f.relayed.Load(), f.direct.Load())
	}

	// Freeze the relay: the agent's connection is now half-open. New
	// connections go straight to the API server.
	f.viaRelay.Store(false)
	if err := relay.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	create(t, c.Client(), service("ho", "after", "10.96.8.11", p80))

	// Within a minute of the last frame (plus the reflector's retry and a
	// margin for a loaded machine): a bound, not a performance assertion.
	a.WaitPlanLines(75*time.Second, []string{
		"TCP  10.96.8.10:80 ClusterIP ho/before -> (none)",
		"TCP  10.96.8.11:80 ClusterIP ho/after -> (none)",
	})
	t.Logf("half-open connection replaced after %s (%d connections through the relay, %d direct)",
		time.Since(frozen).Round(time.Second), f.relayed.Load(), f.direct.Load())
	if f.direct.Load() == 0 {
		t.Errorf("the agent saw the new Service without dialling again")
	}
	// The agent's log says why it dialled again (client-go's reflector
	// messages reach it through klog).
	if !strings.Contains(a.Log(), "http2: client connection lost") {
		t.Errorf("the agent log does not mention the lost connection")
	}
	for _, l := range strings.Split(a.Log(), "\n") {
		if strings.Contains(l, "lost") || strings.Contains(l, "watch") || strings.Contains(l, "timed out") {
			t.Logf("agent: %s", l)
		}
	}
}

// agentWithKubeconfig starts a plan-mode agent with the caller's kubeconfig.
func agentWithKubeconfig(t *testing.T, kc, nodeName string) *agenttest.Agent {
	t.Helper()
	return agenttest.Start(t, agenttest.Options{Config: fmt.Sprintf(`mode: plan
kubeconfig: %q
nodeName: %q
stateDir: %q
sync: {minPeriod: 100ms, period: 30s}
`, kc, nodeName, t.TempDir())})
}
