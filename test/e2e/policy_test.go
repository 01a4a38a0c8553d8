package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/edgeproxy/edgeproxy/test/agenttest"
	"github.com/edgeproxy/edgeproxy/test/cluster"
)

var modules struct {
	once sync.Once
	dir  string
	err  error
}

// moduleDir returns a directory with the example modules built from
// source: bin/modules when `make test` built it, else a fresh build.
func moduleDir(t *testing.T) string {
	t.Helper()
	modules.once.Do(func() {
		root, _ := filepath.Abs(filepath.Join("..", ".."))
		if _, err := os.Stat(filepath.Join(root, "bin", "modules", "topology.wasm")); err == nil {
			modules.dir = filepath.Join(root, "bin", "modules")
			return
		}
		modules.dir, modules.err = os.MkdirTemp("", "edgeproxy-modules-")
		if modules.err == nil {
			out, err := exec.Command(filepath.Join(root, "modules", "build.sh"), modules.dir).CombinedOutput()
			if err != nil {
				modules.err = fmt.Errorf("modules/build.sh: %v\n%s", err, out)
			}
		}
	})
	if modules.err != nil {
		t.Fatal(modules.err)
	}
	return modules.dir
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, to, string(b))
}

// Policy chains through the real binary against the real API server: the
// topology module follows endpoints between nodes and zones, the weighted
// module turns an annotation into weights, and a broken module file on a
// config reload leaves the running chain in place.
func TestPolicyChains(t *testing.T) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	client := c.Client()
	node(t, c, "pol-a", "zone-a", "192.0.2.71")
	node(t, c, "pol-a2", "zone-a", "192.0.2.72")
	node(t, c, "pol-b", "zone-b", "192.0.2.73")
	mods := moduleDir(t)
	work := t.TempDir()
	copyFile(t, filepath.Join(mods, "topology.wasm"), filepath.Join(work, "topology.wasm"))
	copyFile(t, filepath.Join(mods, "weighted.wasm"), filepath.Join(work, "weighted.wasm"))

	policy := func(minEndpoints int) string {
		return fmt.Sprintf(`
policy:
  engine: interpreter
  timeout: 500ms
  modules:
    - {name: topology, path: %q}
    - {name: weighted, path: %q}
  chains:
    - name: near
      match: {namespaces: [%s], labels: {policy: near}}
      modules: [{module: topology, config: {minEndpoints: %d}}]
    - name: canary
      match: {namespaces: [%s], labels: {policy: canary}}
      modules: [{module: weighted, config: {default: 1}}]
`, filepath.Join(work, "topology.wasm"), filepath.Join(work, "weighted.wasm"), ns, minEndpoints, ns)
	}
	a := planAgent(t, c, "pol-a", policy(1))
	withLabel := func(v string) svcOpt {
		return func(s *corev1.Service) { s.Labels = map[string]string{"policy": v} }
	}
	p80 := []corev1.ServicePort{tcp("", 80, intstr.FromInt32(8080))}
	create(t, client, service(ns, "near", "10.96.7.10", p80, withLabel("near")))
	create(t, client, service(ns, "canary", "10.96.7.11", p80, withLabel("canary"), func(s *corev1.Service) {
		s.Annotations = map[string]string{"edgeproxy.io/weights": "node:pol-b=3,default=1"}
	}))
	pod(t, c, ns, "near-b", "pol-b", "10.244.8.3", "near")
	pod(t, c, ns, "near-a2", "pol-a2", "10.244.8.2", "near")
	pod(t, c, ns, "canary-a", "pol-a", "10.244.8.11", "canary")
	pod(t, c, ns, "canary-b", "pol-b", "10.244.8.13", "canary")

	// No endpoint on this node: topology keeps traffic in zone-a.
	a.WaitPlanLines(converge, []string{
		fmt.Sprintf("TCP  10.96.7.10:80 ClusterIP %s/near -> 10.244.8.2:8080 w=1", ns),
		// weighted: the annotation gives pol-b's endpoint 3, the rest 1.
		fmt.Sprintf("TCP  10.96.7.11:80 ClusterIP %s/canary -> 10.244.8.11:8080 w=1, 10.244.8.13:8080 w=3", ns),
	})
	// An endpoint appears on this node: topology moves traffic to it.
	pod(t, c, ns, "near-a", "pol-a", "10.244.8.1", "near")
	a.WaitPlanLines(converge, []string{fmt.Sprintf("TCP  10.96.7.10:80 ClusterIP %s/near -> 10.244.8.1:8080 w=1", ns)})
	// Zone-a empties: traffic goes to the other zone.
	for _, p := range []string{"near-a", "near-a2"} {
		if err := c.SetPodReady(ctxFor(t), ns, p, false); err != nil {
			t.Fatal(err)
		}
	}
	a.WaitPlanLines(converge, []string{fmt.Sprintf("TCP  10.96.7.10:80 ClusterIP %s/near -> 10.244.8.3:8080 w=1", ns)})
	if v, err := a.Metric(`edgeproxy_config_reload_total{result="error"}`); err != nil || v != 0 {
		t.Fatalf("reload errors before the broken module: %v %v", v, err)
	}

	// The topology module file is replaced by a broken one and the config
	// changes (minEndpoints 2): the reload is refused, the running chain
	// (with minEndpoints 1) stays, and the plan does not move.
	writeFile(t, filepath.Join(work, "topology.wasm"), "\x00asm\x01\x00\x00\x00garbage")
	a.WriteConfig(readConfigWith(t, a, policy(2)))
	a.Eventually(converge, "policy reload refused", func() error {
		if !strings.Contains(a.Log(), "policy reload failed; the running chains stay in force") {
			return fmt.Errorf("no refusal logged yet")
		}
		return nil
	})
	if err := c.SetPodReady(ctxFor(t), ns, "near-a2", true); err != nil {
		t.Fatal(err)
	}
	// minEndpoints 1 (the running chain) picks zone-a's one endpoint;
	// minEndpoints 2 would have widened to both zones.
	a.WaitPlanLines(converge, []string{fmt.Sprintf("TCP  10.96.7.10:80 ClusterIP %s/near -> 10.244.8.2:8080 w=1", ns)})
}

// readConfigWith returns the agent's config file with its policy section
// replaced by policy.
func readConfigWith(t *testing.T, a *agenttest.Agent, policy string) string {
	t.Helper()
	b, err := os.ReadFile(a.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "\npolicy:")
	j := strings.Index(s, "\nsync:")
	if i < 0 || j < i {
		t.Fatalf("config layout unexpected:\n%s", s)
	}
	return s[:i] + policy + s[j:]
}
