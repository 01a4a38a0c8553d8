package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/agent/planner"
	"github.com/edgeproxy/edgeproxy/agent/policychain"
	"github.com/edgeproxy/edgeproxy/modules/modbuild"
	"github.com/edgeproxy/edgeproxy/test/agenttest"
	"github.com/edgeproxy/edgeproxy/test/cluster"
)

// Shadow rollout through the real binary against the real API server: a
// candidate weighted module with another default runs next to the active
// one, and a module that spins runs as a second shadow. The plan keeps the
// active module's weights; the differences are counted, served on
// /debug/shadow and shown by `edgeproxy explain`; the spinning shadow's
// failures are counted and change nothing; promoting the candidate by
// editing the config file (hot reload) changes the weights.
func TestPolicyShadow(t *testing.T) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	client := c.Client()
	node(t, c, "sh-a", "zone-a", "192.0.2.81")
	node(t, c, "sh-b", "zone-a", "192.0.2.82")
	node(t, c, "sh-c", "zone-b", "192.0.2.83")
	work := t.TempDir()
	weighted := filepath.Join(work, "weighted.wasm")
	copyFile(t, filepath.Join(moduleDir(t), "weighted.wasm"), weighted)
	loop := filepath.Join(work, "loop.wasm")
	if err := os.WriteFile(loop, modbuild.Build(t, "modules/testdata/hostile/loop"), 0o644); err != nil {
		t.Fatal(err)
	}

	// The chain step runs `step` with default `def`; shadows lists the
	// shadow modules' YAML.
	policy := func(step string, def int, shadows string) string {
		return fmt.Sprintf(`
policy:
  engine: interpreter
  timeout: 500ms
  shadowBudget: 2s
  modules:
    - {name: weighted, path: %[1]q}
%[2]s
  chains:
    - name: canary
      match: {namespaces: [%[3]s]}
      modules: [{module: %[4]s, config: {default: %[5]d}}]
`, weighted, shadows, ns, step, def)
	}
	shadows := fmt.Sprintf(`    - {name: weighted-next, path: %q, shadowOf: weighted, config: {default: 40}}
    - {name: spin, path: %q, shadowOf: weighted, config: {only: %s}}`, weighted, loop, ns)
	a := planAgent(t, c, "sh-a", policy("weighted", 10, shadows))

	p80 := []corev1.ServicePort{tcp("", 80, intstr.FromInt32(8080))}
	create(t, client, service(ns, "web", "10.96.8.10", p80, func(s *corev1.Service) {
		s.Annotations = map[string]string{"edgeproxy.io/weights": "node:sh-b=20"}
	}))
	pod(t, c, ns, "web-a", "sh-a", "10.244.9.1", "web")
	pod(t, c, ns, "web-b", "sh-b", "10.244.9.2", "web")
	pod(t, c, ns, "web-c", "sh-c", "10.244.9.3", "web")

	// The active module's split, 10:20:10; the candidate would give 40:20:40.
	active := fmt.Sprintf("TCP  10.96.8.10:80 ClusterIP %s/web -> 10.244.9.1:8080 w=10, 10.244.9.2:8080 w=20, 10.244.9.3:8080 w=10", ns)
	a.WaitPlanLines(converge, []string{active}, "w=40")
	a.Eventually(converge, "shadow differences counted", func() error {
		if v, err := a.Metric(`edgeproxy_policy_shadow_diff_total{module="weighted-next"}`); err != nil || v < 1 {
			return fmt.Errorf("edgeproxy_policy_shadow_diff_total = %v (%v)", v, err)
		}
		if v, err := a.Metric(`edgeproxy_policy_shadow_failures_total{module="spin",reason="timeout"}`); err != nil || v < 1 {
			return fmt.Errorf(`shadow failures of spin (timeout) = %v (%v)`, v, err)
		}
		return nil
	})
	// The spinning shadow's failures are its own: the chain never failed.
	for _, m := range []string{`edgeproxy_policy_fallbacks_total{chain="canary",policy="keep-builtin"}`, `edgeproxy_policy_module_failures_total{module="weighted",reason="timeout"}`} {
		if v, err := a.Metric(m); err != nil || v > 0 {
			t.Errorf("%s = %v (%v), want none", m, v, err)
		}
	}

	// /debug/shadow serves the recorded difference.
	code, body, err := a.Get("/debug/shadow?service=" + ns + "/web")
	if err != nil || code != 200 {
		t.Fatalf("/debug/shadow: %d %v %s", code, err, body)
	}
	var rep policychain.ShadowReport
	if err := json.Unmarshal(body, &rep); err != nil {
		t.Fatalf("/debug/shadow: %v\n%s", err, body)
	}
	var diff *policychain.ShadowDiff
	for i := range rep.Diffs {
		if rep.Diffs[i].Module == "weighted-next" {
			diff = &rep.Diffs[i]
		}
	}
	if diff == nil || diff.Service != (model.ServicePortName{Namespace: ns, Name: "web"}) || diff.Of != "weighted" || len(diff.InputSHA256) != 64 ||
		!slices.Equal(diff.Active.Weights, []uint32{10, 20, 10}) || !slices.Equal(diff.Shadow.Weights, []uint32{40, 20, 40}) ||
		!strings.Contains(diff.Reason, "weights differ at 2 of 3 endpoints") {
		t.Fatalf("/debug/shadow: no difference of weighted-next as expected:\n%s", body)
	}
	if len(rep.Modules) != 2 || rep.Modules[1].Module != "spin" || rep.Modules[1].Failures["timeout"] == 0 {
		t.Errorf("/debug/shadow modules: %+v", rep.Modules)
	}

	// explain shows it, in text and JSON.
	bin := agenttest.Binary(t)
	out, err := exec.Command(bin, "explain", "--server", a.Metrics, ns+"/web").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "shadow weighted-next (of weighted, never programmed): [40 20 40] differs (weights differ at 2 of 3 endpoints") ||
		!strings.Contains(string(out), "shadow spin (of weighted, never programmed): FAILED") {
		t.Fatalf("explain: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "explain", "--server", a.Metrics, ns+"/web", "-o", "json").Output()
	if err != nil {
		t.Fatalf("explain -o json: %v", err)
	}
	var ex map[string][]planner.Explain
	if err := json.Unmarshal(out, &ex); err != nil {
		t.Fatalf("explain -o json: %v\n%s", err, out)
	}
	var v policychain.Verdict
	pe := ex[ns+"/web"]
	if len(pe) == 0 {
		t.Fatalf("explain -o json: no %s/web:\n%s", ns, out)
	}
	b, _ := json.Marshal(pe[0].Policy)
	if err := json.Unmarshal(b, &v); err != nil || len(v.Shadows) != 2 || v.Shadows[0].Diff != diff.Reason ||
		v.Shadows[0].InputSHA256 != diff.InputSHA256 || !slices.Equal(v.Weights, []uint32{10, 20, 10}) {
		t.Fatalf("explain -o json policy: %v %+v", err, v)
	}
	// The plan, and so the split, is still the active module's.
	a.WaitPlanLines(converge, []string{active}, "w=40")

	// Promotion: the chain step runs weighted-next (with its config), its
	// shadowOf is gone; the config file is edited, the agent reloads it.
	promoted := fmt.Sprintf(`    - {name: weighted-next, path: %q}`, weighted)
	a.WriteConfig(readConfigWith(t, a, policy("weighted-next", 40, promoted)))
	a.WaitPlanLines(converge, []string{
		fmt.Sprintf("TCP  10.96.8.10:80 ClusterIP %s/web -> 10.244.9.1:8080 w=40, 10.244.9.2:8080 w=20, 10.244.9.3:8080 w=40", ns),
	})
	code, body, err = a.Get("/debug/shadow")
	if err != nil || code != 200 || json.Unmarshal(body, &rep) != nil || len(rep.Modules) != 0 {
		t.Fatalf("/debug/shadow after the promotion: %d %v %s", code, err, body)
	}
}
