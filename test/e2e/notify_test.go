package e2e

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/edgeproxy/edgeproxy/test/agenttest"
	"github.com/edgeproxy/edgeproxy/test/cluster"
)

// The agent speaks systemd's notify protocol to a real unixgram socket:
// STATUS= lines while it starts, READY=1 once, only when the first plan is
// programmed, and steady WATCHDOG=1 pings while the sync loop turns.
func TestNotifyManifestSource(t *testing.T) {
	sock := agenttest.ListenNotify(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "web.yaml"), fmt.Sprintf(manifestWeb, "true"))
	a := agenttest.Start(t, agenttest.Options{
		Config: fmt.Sprintf("mode: plan\nmanifests: %q\nnodeName: m-node\nsync: {minPeriod: 100ms, period: 200ms}\n", dir),
		Env:    sock.Env(),
	})

	var ready int
	sock.WaitFor(t, converge, "READY=1", func() bool {
		ready = sock.Index(0, "READY=1")
		return ready >= 0
	})
	// READY=1 means the plan is programmed: it must be served right now,
	// without waiting for anything else.
	p, err := a.Plan()
	if err != nil {
		t.Fatalf("READY=1 arrived but no plan is served: %v", err)
	}
	const line = "TCP  10.96.9.10:80 ClusterIP m/web:http -> 10.244.9.1:8080 w=1"
	if !strings.Contains(p.Text, line) {
		t.Errorf("READY=1 arrived but the plan lacks %q:\n%s", line, p.Text)
	}
	// A STATUS= line said what it was doing before it was ready, and the
	// READY datagram carries what was programmed.
	if i := sock.Index(0, "STATUS="); i < 0 || i > ready {
		t.Errorf("no STATUS= line before or with READY=1 (first STATUS at %d, READY at %d)", i, ready)
	}
	if msg := sock.All()[ready]; !strings.Contains(msg, "STATUS=programmed") {
		t.Errorf("READY datagram %q does not say what was programmed", msg)
	}

	// The sync loop keeps turning: pings keep arriving (every WatchdogSec/2),
	// and STATUS= lines name the generation.
	after := len(sock.All())
	sock.WaitPings(t, after, 6, 15*time.Second)
	if sock.Index(after, "STATUS=generation") < 0 {
		t.Errorf("no STATUS=generation … line after READY")
	}
	if n := sock.Count(0, "READY=1"); n != 1 {
		t.Errorf("READY=1 sent %d times, want once", n)
	}

	// SIGTERM: STOPPING=1 is the last word.
	a.Stop()
	if sock.Index(after, "STOPPING=1") < 0 {
		t.Errorf("no STOPPING=1 on SIGTERM")
	}
}

// With the API server as source: no READY=1 while nothing could be
// programmed (API server down, no snapshot); READY=1 once it is; and the
// watchdog pings go on while the API server is unreachable, because an
// unreachable control plane makes the node stale, not hung.
func TestNotifyAPIServerDown(t *testing.T) {
	c := cluster.New(t, cluster.Options{})
	ctx := ctxFor(t)
	if err := c.CreateNamespace(ctx, "ntf"); err != nil {
		t.Fatal(err)
	}
	create(t, c.Client(), service("ntf", "web", "10.96.7.10", []corev1.ServicePort{tcp("", 80, intstr.FromInt32(8080))}))
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := c.WriteKubeconfig(kc, c.URL); err != nil {
		t.Fatal(err)
	}
	if err := c.StopAPIServer(); err != nil {
		t.Fatal(err)
	}

	sock := agenttest.ListenNotify(t)
	a := agenttest.Start(t, agenttest.Options{
		Config: fmt.Sprintf(`mode: plan
kubeconfig: %q
nodeName: ntf-a
stateDir: %q
sync: {minPeriod: 100ms, period: 200ms}
offline: {startTimeout: 1s, snapshotInterval: 0s}
`, kc, t.TempDir()),
		Env: sock.Env(),
	})
	sock.WaitFor(t, converge, "STATUS=waiting", func() bool { return sock.Index(0, "STATUS=waiting") >= 0 })
	// Past the offline start timeout, with no snapshot to fall back on,
	// nothing is programmed, so nothing may claim readiness.
	a.Eventually(converge, "no-snapshot log line", func() error {
		if !strings.Contains(a.Log(), "there is no snapshot yet") {
			return errors.New("agent has not given up on the snapshot yet")
		}
		return nil
	})
	if i := sock.Index(0, "READY=1"); i >= 0 {
		t.Fatalf("READY=1 sent while nothing was programmed (datagram %d)", i)
	}
	if _, err := a.Plan(); err == nil {
		t.Fatalf("a plan is served although nothing was programmed")
	}

	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	var ready int
	sock.WaitFor(t, 2*converge, "READY=1 after the API server came back", func() bool {
		ready = sock.Index(0, "READY=1")
		return ready >= 0
	})
	p, err := a.Plan()
	if err != nil {
		t.Fatalf("READY=1 arrived but no plan is served: %v", err)
	}
	if !strings.Contains(p.Text, "TCP  10.96.7.10:80 ClusterIP ntf/web -> (none)") {
		t.Errorf("READY=1 arrived but the plan lacks ntf/web:\n%s", p.Text)
	}
	sock.WaitPings(t, ready, 3, 15*time.Second)

	// The uplink drops: pings continue while the API server is down.
	if err := c.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	if conn, err := net.DialTimeout("tcp", strings.TrimPrefix(c.URL, "https://"), time.Second); err == nil {
		conn.Close()
		t.Fatalf("the API server still accepts connections after StopAPIServer")
	}
	down := len(sock.All())
	sock.WaitPings(t, down, 10, 20*time.Second)
	code, h, err := a.Health()
	if err != nil || code != 200 || !h.Healthy {
		t.Errorf("/healthz with the API server down: %d %+v %v", code, h, err)
	}
	if h.APIServerLastContact.After(stopped) {
		t.Errorf("API contact at %s, after the API server stopped at %s", h.APIServerLastContact, stopped)
	}
	if a.Exited() {
		t.Fatalf("agent exited with the API server down")
	}
}
