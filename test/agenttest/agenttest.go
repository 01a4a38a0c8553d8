// Package agenttest runs the real edgeproxy binary for end-to-end tests: it
// writes a config file, starts the process (optionally inside a network
// namespace), reads its HTTP endpoints, and stops it by PID when the test
// ends, printing its log if the test failed.
package agenttest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/agent"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/logbuf"
)

// Binary returns the edgeproxy binary to test: $EDGEPROXY_BIN (set by make
// test), else one built once per test process with go build.
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("EDGEPROXY_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("EDGEPROXY_BIN: %v", err)
		}
		return p
	}
	build.once.Do(func() {
		dir, err := os.MkdirTemp("", "edgeproxy-bin-")
		if err != nil {
			build.err = err
			return
		}
		build.path = filepath.Join(dir, "edgeproxy")
		cmd := exec.Command("go", "build", "-o", build.path, "github.com/edgeproxy/edgeproxy/agent/cmd/edgeproxy")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if build.err != nil {
		t.Fatalf("build edgeproxy: %v", build.err)
	}
	return build.path
}

var build struct {
	once sync.Once
	path string
	err  error
}

// Options describe one agent process.
type Options struct {
	// Config is the YAML config file content. The harness sets
	// server.healthz and server.metrics to free loopback ports unless the
	// config sets them (then set Healthz/Metrics to the same values).
	Config string
	// Args are extra command-line arguments after "run".
	Args []string
	// NetNS runs the agent inside this named network namespace (ip netns).
	NetNS string
	// Env is added to the process environment.
	Env []string
	// Healthz and Metrics are the addresses the config uses, when it sets them.
	Healthz, Metrics string
}

// Agent is a running edgeproxy process.
type Agent struct {
	t          testing.TB
	Dir        string
	ConfigPath string
	Healthz    string
	Metrics    string
	cmd        *exec.Cmd
	log        *logbuf.Buffer
	done       chan struct{}
	exitErr    error
	opts       Options
}

// Start writes the config and starts the agent; it is stopped (SIGTERM,
// then SIGKILL) when t ends.
func Start(t testing.TB, opts Options) *Agent {
	t.Helper()
	a := &Agent{t: t, Dir: t.TempDir(), opts: opts, Healthz: opts.Healthz, Metrics: opts.Metrics}
	if a.Healthz == "" {
		a.Healthz = freeAddr(t)
	}
	if a.Metrics == "" {
		a.Metrics = freeAddr(t)
	}
	cfg := opts.Config
	if !strings.Contains(cfg, "\nserver:") && !strings.HasPrefix(cfg, "server:") {
		cfg += fmt.Sprintf("\nserver:\n  healthz: %q\n  metrics: %q\n", a.Healthz, a.Metrics)
	}
	a.ConfigPath = filepath.Join(a.Dir, "config.yaml")
	if err := os.WriteFile(a.ConfigPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	a.start()
	t.Cleanup(func() {
		a.Stop()
		if t.Failed() {
			t.Logf("edgeproxy log:\n%s", a.Log())
		}
	})
	return a
}

func (a *Agent) start() {
	a.t.Helper()
	bin := Binary(a.t)
	args := append([]string{"run", "--config", a.ConfigPath}, a.opts.Args...)
	var cmd *exec.Cmd
	if a.opts.NetNS != "" {
		gate.Binaries(a.t, "ip")
		cmd = exec.Command("ip", append([]string{"netns", "exec", a.opts.NetNS, bin}, args...)...)
	} else {
		cmd = exec.Command(bin, args...)
	}
	cmd.Env = append(os.Environ(), a.opts.Env...)
	if a.log == nil {
		a.log = &logbuf.Buffer{}
	}
	cmd.Stdout, cmd.Stderr = a.log, a.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		a.t.Fatalf("start edgeproxy: %v", err)
	}
	a.cmd, a.done = cmd, make(chan struct{})
	go func() {
		a.exitErr = cmd.Wait()
		close(a.done)
	}()
}

// Stop ends the process: SIGTERM, then SIGKILL after 10 s.
func (a *Agent) Stop() {
	a.signal(syscall.SIGTERM, 10*time.Second)
}

// Kill ends the process with SIGKILL, as a crash would.
func (a *Agent) Kill() {
	a.signal(syscall.SIGKILL, 10*time.Second)
}

// Restart starts the process again with the same config.
func (a *Agent) Restart() {
	a.t.Helper()
	a.Stop()
	a.start()
}

// Exited reports whether the process has ended.
func (a *Agent) Exited() bool {
	select {
	case <-a.done:
		return true
	default:
		return false
	}
}

func (a *Agent) signal(sig syscall.Signal, grace time.Duration) {
	if a.cmd == nil || a.Exited() {
		return
	}
	_ = a.cmd.Process.Signal(sig)
	select {
	case <-a.done:
	case <-time.After(grace):
		_ = a.cmd.Process.Kill()
		<-a.done
	}
}

// WriteConfig replaces the config file the agent watches, the way an editor
// does: write a temp file, rename it over the old one.
func (a *Agent) WriteConfig(content string) {
	a.t.Helper()
	tmp := a.ConfigPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		a.t.Fatal(err)
	}
	if err := os.Rename(tmp, a.ConfigPath); err != nil {
		a.t.Fatal(err)
	}
}

// Log returns everything the process printed so far.
func (a *Agent) Log() string { return a.log.String() }

// Get fetches path from the metrics server (or the healthz server for
// /healthz and /livez) and returns the status code and body.
func (a *Agent) Get(path string) (int, []byte, error) {
	addr := a.Metrics
	if path == "/healthz" || path == "/livez" {
		addr = a.Healthz
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// Plan returns the agent's current plan, or an error before the first sync.
func (a *Agent) Plan() (*agent.PlanView, error) {
	code, body, err := a.Get("/debug/plan")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("/debug/plan: %d %s", code, body)
	}
	var v agent.PlanView
	if err := json.Unmarshal(body, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// Health returns the /healthz status code and answer.
func (a *Agent) Health() (int, agent.Health, error) {
	code, body, err := a.Get("/healthz")
	var h agent.Health
	if err == nil {
		err = json.Unmarshal(body, &h)
	}
	return code, h, err
}

// Metric returns the value of the first sample of the metric whose line
// starts with prefix (name plus optional labels), or -1 when absent.
func (a *Agent) Metric(prefix string) (float64, error) {
	code, body, err := a.Get("/metrics")
	if err != nil {
		return 0, err
	}
	if code != http.StatusOK {
		return 0, fmt.Errorf("/metrics: %d", code)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, prefix+" ") {
			var v float64
			_, err := fmt.Sscanf(strings.TrimPrefix(line, prefix+" "), "%g", &v)
			return v, err
		}
	}
	return -1, nil
}

// Eventually polls cond every 100 ms until it returns nil or timeout passes,
// then fails the test with the last error. The bound keeps a broken agent
// from hanging the suite; it is not a performance assertion.
func (a *Agent) Eventually(timeout time.Duration, what string, cond func() error) {
	a.t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for {
		if err = cond(); err == nil {
			return
		}
		if a.Exited() {
			a.t.Fatalf("%s: edgeproxy exited (%v); last check: %v", what, a.exitErr, err)
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// WaitPlanLines waits until the plan text contains every want line and none
// of the absent substrings, and returns the plan.
func (a *Agent) WaitPlanLines(timeout time.Duration, want []string, absent ...string) *agent.PlanView {
	a.t.Helper()
	var last *agent.PlanView
	a.Eventually(timeout, "plan", func() error {
		p, err := a.Plan()
		if err != nil {
			return err
		}
		last = p
		lines := map[string]bool{}
		for _, l := range strings.Split(p.Text, "\n") {
			lines[l] = true
		}
		for _, w := range want {
			if !lines[w] {
				return fmt.Errorf("missing line %q in plan:\n%s", w, p.Text)
			}
		}
		for _, s := range absent {
			if strings.Contains(p.Text, s) {
				return fmt.Errorf("plan still contains %q:\n%s", s, p.Text)
			}
		}
		return nil
	})
	return last
}

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
