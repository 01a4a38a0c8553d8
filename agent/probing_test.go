package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
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

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/agent/prober"
	"github.com/edgeproxy/edgeproxy/agent/state"
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

// clusterIPEndpoints returns the endpoints of the last plan's ClusterIP
// frontend of service port svc.
func clusterIPEndpoints(b *flaky, svc datapath.ServicePortName) []netip.AddrPort {
	plans := b.got()
	if len(plans) == 0 {
		return nil
	}
	var out []netip.AddrPort
	for _, f := range plans[len(plans)-1].Frontends {
		if f.Kind == datapath.ClusterIP && f.Service == svc {
			for _, e := range f.Endpoints {
				out = append(out, e.Addr)
			}
		}
	}
	slices.SortFunc(out, func(a, b netip.AddrPort) int { return a.Compare(b) })
	return out
}

// probeWorld is three Services over the same three endpoints: web (probed
// by default), quiet (edgeproxy.io/offline-probe: "false") and alt
// (probed at port 9090 instead of the target port).
const probeWorld = `apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: t, annotations: {%[2]s}}
spec: {clusterIP: %[3]s, ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %[1]s-1, namespace: t, labels: {kubernetes.io/service-name: %[1]s}}
addressType: IPv4
ports: [{port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.244.0.2], conditions: {ready: true}}
- {addresses: [10.244.0.3], conditions: {ready: true}}
- {addresses: [10.244.0.4], conditions: {ready: true}}
`

// With health.mode: always, an endpoint whose listener dies is left out
// of the plan after failureThreshold probes, named in status and
// explain, and comes back when it listens again; when all of them die,
// all are kept. A Service annotated offline-probe "false" keeps its dead
// endpoint; one annotated "9090" is judged by port 9090 alone. The probes
// are real TCP connects, to loopback listeners that stand for the
// endpoints (an EndpointSlice cannot hold loopback addresses); the
// datapath records the plans.
func TestProbedEndpointsLeftOut(t *testing.T) {
	local := map[netip.AddrPort]netip.AddrPort{}
	servers := map[uint16][]*probedServer{}
	var addrs []netip.AddrPort
	for _, port := range []uint16{8080, 9090} {
		for i := range 3 {
			s := &probedServer{
				addr:  netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 0, byte(2 + i)}), port),
				local: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), freePort(t)),
			}
			s.start(t)
			local[s.addr] = s.local
			servers[port] = append(servers[port], s)
			if port == 8080 {
				addrs = append(addrs, s.addr)
			}
		}
	}
	dial := func(ctx context.Context, tgt prober.Target) error {
		return prober.DialTCP(ctx, local[tgt.Addr])
	}
	dir := t.TempDir()
	manifest := fmt.Sprintf(probeWorld, "web", "", "10.96.0.5") + "---\n" +
		fmt.Sprintf(probeWorld, "quiet", `edgeproxy.io/offline-probe: "false"`, "10.96.0.6") + "---\n" +
		fmt.Sprintf(probeWorld, "alt", `edgeproxy.io/offline-probe: "9090"`, "10.96.0.7")
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	b := &flaky{}
	a := startProbingAgent(t, b, dir, dial)
	<-a.Synced()
	eventually(t, "three endpoints", func() bool {
		return slices.Equal(clusterIPEndpoints(b, datapath.ServicePortName{Namespace: "t", Name: "web"}), addrs)
	})
	without1 := []netip.AddrPort{addrs[0], addrs[2]}

	servers[8080][1].stop()
	eventually(t, "the dead endpoint left out", func() bool {
		return slices.Equal(clusterIPEndpoints(b, datapath.ServicePortName{Namespace: "t", Name: "web"}), without1)
	})
	if v, ok := a.ProbeVerdicts()[datapath.ServicePortName{Namespace: "t", Name: "web"}][addrs[1]]; !ok || v.Reason() == "" {
		t.Errorf("no reason for the endpoint left out: %v", a.ProbeVerdicts())
	}
	if got := clusterIPEndpoints(b, datapath.ServicePortName{Namespace: "t", Name: "quiet"}); !slices.Equal(got, addrs) {
		t.Errorf("offline-probe false: endpoints %v, want all three (not probed)", got)
	}
	if got := clusterIPEndpoints(b, datapath.ServicePortName{Namespace: "t", Name: "alt"}); !slices.Equal(got, addrs) {
		t.Errorf("offline-probe 9090 with 9090 up: endpoints %v, want all three", got)
	}
	rec := httptest.NewRecorder()
	a.serveStatus(rec, httptest.NewRequest("GET", "/debug/status", nil))
	if body := rec.Body.String(); !strings.Contains(body, `"10.244.0.3:8080": "probe: `) {
		t.Errorf("status does not name the endpoint left out:\n%s", body)
	}
	if n := probeTargetSeries(t, a, "10.244.0.3:8080", "failed"); n != 1 {
		t.Errorf("perEndpointMetrics: %d series for the failed endpoint, want 1", n)
	}
	rec = httptest.NewRecorder()
	a.serveExplain(rec, httptest.NewRequest("GET", "/debug/explain?service=t/web", nil))
	if body := rec.Body.String(); !strings.Contains(body, "endpoint 10.244.0.3:8080 left out: probe: ") {
		t.Errorf("explain does not give the reason:\n%s", body)
	}
	servers[8080][1].start(t)
	eventually(t, "the endpoint back", func() bool {
		return slices.Equal(clusterIPEndpoints(b, datapath.ServicePortName{Namespace: "t", Name: "web"}), addrs)
	})

	servers[9090][1].stop()
	eventually(t, "alt leaves out the endpoint whose 9090 died", func() bool {
		return slices.Equal(clusterIPEndpoints(b, datapath.ServicePortName{Namespace: "t", Name: "alt"}), without1)
	})
	if got := clusterIPEndpoints(b, datapath.ServicePortName{Namespace: "t", Name: "web"}); !slices.Equal(got, addrs) {
		t.Errorf("web (probed at 8080) lost an endpoint to alt's probe port: %v", got)
	}
	servers[9090][1].start(t)

	for _, s := range servers[8080] {
		s.stop()
	}
	eventually(t, "every endpoint failed", func() bool {
		return a.probes.prober.Counts()[prober.Failed] == 3
	})
	gen := a.Last().Plan.Generation
	eventually(t, "a sync after every endpoint failed", func() bool { a.runner.Run(); return a.Last().Plan.Generation > gen })
	if got := clusterIPEndpoints(b, datapath.ServicePortName{Namespace: "t", Name: "web"}); !slices.Equal(got, addrs) {
		t.Errorf("with every endpoint failed the plan has %v, want all three kept", got)
	}
}

// probeTargetSeries counts the edgeproxy_endpoint_probe_target_state
// series of target in state.
func probeTargetSeries(t *testing.T, a *Agent, target, state string) int {
	t.Helper()
	mfs, err := a.opts.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		if mf.GetName() != "edgeproxy_endpoint_probe_target_state" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["target"] == target && labels["state"] == state {
				n++
			}
		}
	}
	return n
}

func TestParseProbeSpec(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want probeSpec
		bad  bool
	}{
		{in: "", want: probeSpec{}},
		{in: " True ", want: probeSpec{}},
		{in: "false", want: probeSpec{off: true}},
		{in: "9090", want: probeSpec{port: 9090}},
		{in: "9090/TCP", want: probeSpec{port: 9090}},
		{in: "53/udp", want: probeSpec{port: 53, udp: true}},
		{in: "0", bad: true},
		{in: "70000", bad: true},
		{in: "53/sctp", bad: true},
		{in: "no", bad: true},
	} {
		got, err := parseProbeSpec(tc.in)
		if (err != nil) != tc.bad || (!tc.bad && got != tc.want) {
			t.Errorf("parseProbeSpec(%q) = %+v, %v; want %+v, error %v", tc.in, got, err, tc.want, tc.bad)
		}
		if err != nil && !strings.Contains(err.Error(), AnnotationOfflineProbe) {
			t.Errorf("parseProbeSpec(%q): error %q does not name the annotation", tc.in, err)
		}
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

func startProbingAgent(t *testing.T, backend datapath.Backend, manifests string, dial prober.DialFunc) *Agent {
	t.Helper()
	cfg := planConfig(t, manifests)
	cfg.Health.Mode = config.HealthAlways
	cfg.Health.PerEndpointMetrics = true
	cfg.Health.Interval, cfg.Health.Timeout, cfg.Health.FailureThreshold = 20*time.Millisecond, 20*time.Millisecond, 2
	return startAgentWith(t, cfg, Options{Backend: backend, ProbeDial: dial})
}

// Issue 29 §7: a bad offline-probe value is checked when the Service is
// read and shown in status and explain; one that reaches probing anyway (a
// snapshot from before) is logged again when it turns bad again.
func TestBadOfflineProbeShown(t *testing.T) {
	dir := t.TempDir()
	manifest := fmt.Sprintf(probeWorld, "web", `edgeproxy.io/offline-probe: "`+strings.Repeat("x", 200_000)+`"`, "10.96.0.5")
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	a := startProbingAgent(t, &flaky{}, dir, func(context.Context, prober.Target) error { return nil })
	<-a.Synced()
	rec := httptest.NewRecorder()
	a.serveStatus(rec, httptest.NewRequest("GET", "/debug/status", nil))
	var st Status
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Skipped) != 1 || st.Skipped[0].Object != "t/web" || !st.Skipped[0].Partly ||
		!strings.Contains(st.Skipped[0].Reason, AnnotationOfflineProbe) || len(st.Skipped[0].Reason) > 400 {
		t.Errorf("status skipped: %.500v", st.Skipped)
	}
	rec = httptest.NewRecorder()
	a.serveExplain(rec, httptest.NewRequest("GET", "/debug/explain?service=t/web", nil))
	if body := rec.Body.String(); !strings.Contains(body, "source: metadata.annotations[edgeproxy.io/offline-probe]: ") {
		t.Errorf("explain does not note the ignored annotation:\n%.2000s", body)
	}
}

func TestProbeSpecsLogABadValueAgain(t *testing.T) {
	var logs bytes.Buffer
	a := &Agent{log: slog.New(slog.NewTextHandler(&logs, nil)), probes: &probing{badSpecs: map[string]string{}}}
	st := state.New(nil)
	for _, v := range []string{"bogus", "bogus", "9090", "bogus"} {
		st.SetService("t/web", &model.Service{Namespace: "t", Name: "web", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.5")},
			Annotations: map[string]string{AnnotationOfflineProbe: v}, Ports: []model.ServicePort{{Protocol: "TCP", Port: 80}}})
		a.probeSpecs(st.Snapshot())
	}
	if n := strings.Count(logs.String(), "Service annotation ignored"); n != 2 {
		t.Errorf("logged %d times, want 2 (bogus, and bogus again after 9090):\n%s", n, logs.String())
	}
}
