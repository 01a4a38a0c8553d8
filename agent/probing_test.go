package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/health"
	"github.com/edgeproxy/edgeproxy/datapath"
)

// probedServer is a TCP listener on a loopback port that can die and
// return; the endpoint it stands for is addr.
type probedServer struct {
	addr, local netip.AddrPort
	l           net.Listener
}

func (s *probedServer) start(t *testing.T) {
	t.Helper()
	l, err := net.Listen("tcp", s.local.String())
	if err != nil {
		t.Fatal(err)
	}
	s.l = l
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { l.Close() })
}

func (s *probedServer) stop() { s.l.Close() }

// clusterIPEndpoints returns the endpoints of the last plan's frontend.
func clusterIPEndpoints(b *flaky) []netip.AddrPort {
	plans := b.got()
	if len(plans) == 0 {
		return nil
	}
	var out []netip.AddrPort
	for _, f := range plans[len(plans)-1].Frontends {
		if f.Kind == datapath.ClusterIP {
			for _, e := range f.Endpoints {
				out = append(out, e.Addr)
			}
		}
	}
	slices.SortFunc(out, func(a, b netip.AddrPort) int { return a.Compare(b) })
	return out
}

// With health.mode: always, an endpoint whose listener dies is left out
// of the plan after failureThreshold probes and comes back when it
// listens again; when all of them die, all are kept. The probes are real
// TCP connects, to loopback listeners that stand for the endpoints (an
// EndpointSlice cannot hold loopback addresses); the datapath records the
// plans.
func TestProbedEndpointsLeftOut(t *testing.T) {
	const port = 8080
	servers := make([]*probedServer, 3)
	local := map[netip.AddrPort]netip.AddrPort{}
	var addrs []netip.AddrPort
	for i := range servers {
		servers[i] = &probedServer{
			addr:  netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 0, byte(2 + i)}), port),
			local: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), freePort(t)),
		}
		servers[i].start(t)
		local[servers[i].addr] = servers[i].local
		addrs = append(addrs, servers[i].addr)
	}
	dial := func(ctx context.Context, addr netip.AddrPort) error {
		return health.DialTCP(ctx, local[addr])
	}
	dir := t.TempDir()
	manifest := fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: web, namespace: t}
spec: {clusterIP: 10.96.0.5, ports: [{port: 80, targetPort: %d}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: t, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: %d, protocol: TCP}]
endpoints:
- {addresses: [10.244.0.2], conditions: {ready: true}}
- {addresses: [10.244.0.3], conditions: {ready: true}}
- {addresses: [10.244.0.4], conditions: {ready: true}}
`, port, port)
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	b := &flaky{}
	a := startProbingAgent(t, b, dir, dial)
	<-a.Synced()
	eventually(t, "three endpoints", func() bool { return slices.Equal(clusterIPEndpoints(b), addrs) })

	servers[1].stop()
	eventually(t, "the dead endpoint left out", func() bool {
		return slices.Equal(clusterIPEndpoints(b), []netip.AddrPort{addrs[0], addrs[2]})
	})
	if v, ok := a.ProbeVerdicts()[addrs[1]]; !ok || v.Reason() == "" {
		t.Errorf("no reason for the endpoint left out: %v", a.ProbeVerdicts())
	}
	rec := httptest.NewRecorder()
	a.serveStatus(rec, httptest.NewRequest("GET", "/debug/status", nil))
	if body := rec.Body.String(); !strings.Contains(body, `"10.244.0.3:8080": "probe: `) {
		t.Errorf("status does not name the endpoint left out:\n%s", body)
	}
	servers[1].start(t)
	eventually(t, "the endpoint back", func() bool { return slices.Equal(clusterIPEndpoints(b), addrs) })

	for _, s := range servers {
		s.stop()
	}
	eventually(t, "every endpoint failed", func() bool {
		return len(a.probes.prober.Counts()) > 0 && a.probes.prober.Counts()[health.Failed] == 3
	})
	gen := a.Last().Plan.Generation
	eventually(t, "a sync after every endpoint failed", func() bool { a.runner.Run(); return a.Last().Plan.Generation > gen })
	if got := clusterIPEndpoints(b); !slices.Equal(got, addrs) {
		t.Errorf("with every endpoint failed the plan has %v, want all three kept", got)
	}
}

func freePort(t *testing.T) uint16 {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

func startProbingAgent(t *testing.T, backend datapath.Backend, manifests string, dial health.DialFunc) *Agent {
	t.Helper()
	cfg := config.Default()
	cfg.NodeName, cfg.Manifests, cfg.Mode = "n1", manifests, "plan"
	cfg.StateDir = t.TempDir()
	cfg.Server = config.Server{}
	cfg.Sync = config.Sync{MinPeriod: 10 * time.Millisecond, Period: time.Hour, HealthTimeout: 300 * time.Millisecond}
	cfg.Health.Mode = config.HealthAlways
	cfg.Health.Interval, cfg.Health.Timeout, cfg.Health.FailureThreshold = 20*time.Millisecond, 20*time.Millisecond, 2
	a, err := New(Options{
		Config: &cfg, Backend: backend, Registry: prometheus.NewRegistry(),
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		ProbeDial: dial,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return a
}
