package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/agent"
	"github.com/edgeproxy/edgeproxy/test/agenttest"
)

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp~"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

const manifestWeb = `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: m}
spec:
  clusterIP: 10.96.9.10
  ports:
    - {name: http, port: 80, protocol: TCP}
    - {name: dns, port: 53, protocol: UDP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-a, namespace: m, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}, {name: dns, port: 5353, protocol: UDP}]
endpoints:
  - {addresses: [10.244.9.1], nodeName: m-node, conditions: {ready: %s}}
  - {addresses: [not-an-ip], nodeName: m-node}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-b, namespace: m, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}, {name: dns, port: 5353, protocol: UDP}]
endpoints:
  - {addresses: [10.244.9.2], nodeName: other, conditions: {ready: false, serving: true, terminating: true}}
`

const manifestIgnored = `
apiVersion: v1
kind: Service
metadata: {name: headless, namespace: m}
spec: {clusterIP: None, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: other, namespace: m, labels: {service.kubernetes.io/service-proxy-name: someone-else}}
spec: {clusterIP: 10.96.9.11, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: local, namespace: m}
spec:
  clusterIP: 10.96.9.12
  internalTrafficPolicy: Local
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: local-1, namespace: m, labels: {kubernetes.io/service-name: local}}
addressType: IPv4
ports: [{port: 80}]
endpoints:
  - {addresses: [10.244.9.5], nodeName: m-node}
  - {addresses: [10.244.9.6], nodeName: other}
`

// The same scenarios against the manifest directory: create, update,
// delete by editing files; bad parts skipped and counted; ignored services.
func TestManifestSource(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "web.yaml"), fmt.Sprintf(manifestWeb, "true"))
	writeFile(t, filepath.Join(dir, "ignored.yaml"), manifestIgnored)
	writeFile(t, filepath.Join(dir, "broken.yaml"), "apiVersion: v1\nkind: Service\nmetadata: {name: x\n")
	a := agenttest.Start(t, agenttest.Options{Config: fmt.Sprintf(`
mode: plan
manifests: %q
nodeName: m-node
stateDir: %q
sync: {minPeriod: 100ms}
`, dir, t.TempDir())})

	a.WaitPlanLines(converge, []string{
		"TCP  10.96.9.10:80 ClusterIP m/web:http -> 10.244.9.1:8080 w=1",
		"UDP  10.96.9.10:53 ClusterIP m/web:dns -> 10.244.9.1:5353 w=1",
		"TCP  10.96.9.12:80 ClusterIP m/local -> 10.244.9.5:80 w=1",
	}, "m/headless", "m/other")

	// Edit: the ready endpoint turns unready; the terminating one serves.
	writeFile(t, filepath.Join(dir, "web.yaml"), fmt.Sprintf(manifestWeb, "false"))
	a.WaitPlanLines(converge, []string{"TCP  10.96.9.10:80 ClusterIP m/web:http -> 10.244.9.2:8080 w=1"})

	// Bad parts were counted: the unparsable address, the broken file.
	if v, err := a.Metric(`edgeproxy_source_objects_skipped_total{kind="EndpointSlice-part",reason="bad"}`); err != nil || v < 1 {
		t.Errorf("skipped endpoint parts = %v (%v), want >= 1", v, err)
	}
	if v, err := a.Metric(`edgeproxy_source_objects_skipped_total{kind="manifest",reason="bad"}`); err != nil || v < 1 {
		t.Errorf("skipped manifests = %v (%v), want >= 1", v, err)
	}
	if n := strings.Count(a.Log(), "not-an-ip"); n != 1 {
		t.Errorf("bad address logged %d times, want once", n)
	}

	// Delete: the file goes, the service goes.
	if err := os.Remove(filepath.Join(dir, "web.yaml")); err != nil {
		t.Fatal(err)
	}
	a.WaitPlanLines(converge, []string{"TCP  10.96.9.12:80 ClusterIP m/local -> 10.244.9.5:80 w=1"}, "m/web")
}

// A bad config edit keeps the running config and is counted; a good edit
// takes effect without a restart; a restart-only key is held back.
func TestConfigReload(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "web.yaml"), fmt.Sprintf(manifestWeb, "true"))
	state := t.TempDir()
	base := fmt.Sprintf("mode: plan\nmanifests: %q\nstateDir: %q\n", dir, state)
	a := agenttest.Start(t, agenttest.Options{Config: base + "nodeName: m-node\nsync: {minPeriod: 100ms, period: 30s}\n"})
	a.WaitPlanLines(converge, []string{"TCP  10.96.9.10:80 ClusterIP m/web:http -> 10.244.9.1:8080 w=1"})
	server := fmt.Sprintf("server: {healthz: %q, metrics: %q}\n", a.Healthz, a.Metrics)
	status := func() agent.Status {
		code, body, err := a.Get("/debug/status")
		if err != nil || code != 200 {
			t.Fatalf("/debug/status: %d %v", code, err)
		}
		var st agent.Status
		if err := json.Unmarshal(body, &st); err != nil {
			t.Fatal(err)
		}
		return st
	}

	a.WriteConfig(base + server + "nodeName: m-node\nsync: {minPeriod: abc, period: 30s}\n")
	a.Eventually(converge, "reload error counted", func() error {
		v, err := a.Metric(`edgeproxy_config_reload_total{result="error"}`)
		if err != nil || v != 1 {
			return fmt.Errorf("reload errors = %v (%v), want 1", v, err)
		}
		return nil
	})
	if !strings.Contains(a.Log(), `sync.minPeriod: \"abc\" is not a duration`) && !strings.Contains(a.Log(), `sync.minPeriod: "abc" is not a duration`) {
		t.Errorf("the log does not say what is wrong:\n%s", a.Log())
	}
	if st := status(); st.Config.Sync.MinPeriod != 100*time.Millisecond {
		t.Fatalf("bad edit changed the running config: minPeriod %s", st.Config.Sync.MinPeriod)
	}

	a.WriteConfig(base + server + "sync: {minPeriod: 200ms, period: 45s}\nlog: {level: debug}\nnodeName: renamed\n")
	a.Eventually(converge, "good edit applied", func() error {
		st := status()
		if st.Config.Sync.Period != 45*time.Second || st.Config.Log.Level != "debug" {
			return fmt.Errorf("running config: period %s, log level %s", st.Config.Sync.Period, st.Config.Log.Level)
		}
		if st.Config.NodeName != "m-node" {
			return fmt.Errorf("restart-only nodeName was applied: %q", st.Config.NodeName)
		}
		return nil
	})
	if v, _ := a.Metric("edgeproxy_config_restart_required"); v != 1 {
		t.Errorf("edgeproxy_config_restart_required = %v, want 1", v)
	}
	// The new log level took effect: debug lines appear.
	a.Eventually(converge, "debug logging", func() error {
		if !strings.Contains(a.Log(), "level=DEBUG") {
			return fmt.Errorf("no debug line yet")
		}
		return nil
	})
}

// `edgeproxy plan` lists once, prints the plan and exits; `status` and
// `explain` read a running agent; both fail helpfully without one.
func TestCommands(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "web.yaml"), fmt.Sprintf(manifestWeb, "true"))
	bin := agenttest.Binary(t)
	out, err := exec.Command(bin, "plan", "--manifests", dir, "--node-name", "m-node").CombinedOutput()
	if err != nil {
		t.Fatalf("edgeproxy plan: %v\n%s", err, out)
	}
	want := "UDP  10.96.9.10:53 ClusterIP m/web:dns -> 10.244.9.1:5353 w=1\nTCP  10.96.9.10:80 ClusterIP m/web:http -> 10.244.9.1:8080 w=1\n"
	if !strings.HasSuffix(string(out), want) {
		t.Errorf("edgeproxy plan printed:\n%s\nwant it to end with:\n%s", out, want)
	}
	out, err = exec.Command(bin, "plan", "--manifests", dir, "--node-name", "m-node", "-o", "json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var p struct{ Frontends []json.RawMessage }
	if err := json.Unmarshal(out, &p); err != nil || len(p.Frontends) != 2 {
		t.Errorf("plan -o json: %d frontends, %v\n%s", len(p.Frontends), err, out)
	}

	a := agenttest.Start(t, agenttest.Options{Config: fmt.Sprintf("mode: plan\nmanifests: %q\nnodeName: m-node\nstateDir: %q\n", dir, t.TempDir())})
	a.WaitPlanLines(converge, []string{"TCP  10.96.9.10:80 ClusterIP m/web:http -> 10.244.9.1:8080 w=1"})
	out, err = exec.Command(bin, "status", "--server", a.Metrics).CombinedOutput()
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	for _, s := range []string{"mode plan", "node m-node", "health: healthy", "m/web:http", "10.96.9.10:80/tcp", "10.244.9.1:8080 (1)"} {
		if !strings.Contains(string(out), s) {
			t.Errorf("status output lacks %q:\n%s", s, out)
		}
	}
	out, err = exec.Command(bin, "explain", "--server", a.Metrics, "m/web").CombinedOutput()
	if err != nil {
		t.Fatalf("explain: %v\n%s", err, out)
	}
	for _, s := range []string{"m/web:http (IPv4)", "10.244.9.1:8080", "ready", "programmed:", "TCP  10.96.9.10:80 ClusterIP m/web:http"} {
		if !strings.Contains(string(out), s) {
			t.Errorf("explain output lacks %q:\n%s", s, out)
		}
	}
	out, err = exec.Command(bin, "explain", "--server", a.Metrics, "m/nope").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not in the plan") {
		t.Errorf("explain of an unknown service: %v\n%s", err, out)
	}
	a.Stop()
	out, err = exec.Command(bin, "status", "--server", a.Metrics).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "is edgeproxy running?") {
		t.Errorf("status without an agent: %v\n%s", err, out)
	}
}
