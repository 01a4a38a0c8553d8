package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/edgeproxy/edgeproxy/test/agenttest"
	"github.com/edgeproxy/edgeproxy/test/cluster"
)

// A node restarts while its uplink is down: the agent programs its last
// known state from the snapshot, and converges to what changed meanwhile
// once the API server is back. A corrupt snapshot is refused, not applied.
func TestOfflineStartFromSnapshot(t *testing.T) {
	c := cluster.New(t, cluster.Options{})
	ctx := ctxFor(t)
	if err := c.CreateNamespace(ctx, "off"); err != nil {
		t.Fatal(err)
	}
	node(t, c, "off-a", "zone-a", "192.0.2.61")
	client := c.Client()
	kc := t.TempDir() + "/kubeconfig"
	if err := c.WriteKubeconfig(kc, c.URL); err != nil {
		t.Fatal(err)
	}
	stateDir := t.TempDir()
	cfg := fmt.Sprintf(`mode: plan
kubeconfig: %q
nodeName: off-a
stateDir: %q
sync: {minPeriod: 100ms, period: 2s}
offline: {startTimeout: 2s, snapshotInterval: 0s}
`, kc, stateDir)
	a := agenttest.Start(t, agenttest.Options{Config: cfg})
	p80 := []corev1.ServicePort{tcp("", 80, intstr.FromInt32(8080))}
	create(t, client, service("off", "gone", "10.96.6.10", p80))
	create(t, client, service("off", "kept", "10.96.6.11", p80))
	a.WaitPlanLines(converge, []string{
		"TCP  10.96.6.10:80 ClusterIP off/gone -> (none)",
		"TCP  10.96.6.11:80 ClusterIP off/kept -> (none)",
	})
	snap := filepath.Join(stateDir, "snapshot.json")
	a.Eventually(converge, "snapshot written", func() error {
		b, err := os.ReadFile(snap)
		if err != nil {
			return err
		}
		if !strings.Contains(string(b), "10.96.6.11") {
			return fmt.Errorf("snapshot lacks the services")
		}
		return nil
	})

	// The agent dies; meanwhile the cluster changes; then the uplink drops.
	a.Kill()
	if err := client.CoreV1().Services("off").Delete(ctx, "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	create(t, client, service("off", "new", "10.96.6.12", p80))
	if err := c.StopAPIServer(); err != nil {
		t.Fatal(err)
	}

	// Restarted without the API server: the last known state is served.
	b := agenttest.Start(t, agenttest.Options{Config: cfg})
	b.WaitPlanLines(converge, []string{
		"TCP  10.96.6.10:80 ClusterIP off/gone -> (none)",
		"TCP  10.96.6.11:80 ClusterIP off/kept -> (none)",
	})
	if !strings.Contains(b.Log(), "programming the last known state") {
		t.Errorf("no log line says the snapshot is in use:\n%s", b.Log())
	}
	if v, err := b.Metric("edgeproxy_snapshot_age_seconds"); err != nil || v < 0 {
		t.Errorf("edgeproxy_snapshot_age_seconds = %v (%v), want >= 0", v, err)
	}
	if code, h, err := b.Health(); err != nil || code != 200 || !h.Healthy {
		t.Errorf("/healthz while serving the snapshot: %d %+v %v", code, h, err)
	}

	// The API server returns: one convergence to what changed meanwhile.
	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	b.WaitPlanLines(2*converge, []string{
		"TCP  10.96.6.11:80 ClusterIP off/kept -> (none)",
		"TCP  10.96.6.12:80 ClusterIP off/new -> (none)",
	}, "off/gone")

	// A corrupt snapshot is refused whole, with a clear log line.
	b.Kill()
	if err := c.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(snap)
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)/2] ^= 0x20
	if err := os.WriteFile(snap, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	d := agenttest.Start(t, agenttest.Options{Config: cfg})
	d.Eventually(converge, "refusal logged", func() error {
		if !strings.Contains(d.Log(), "snapshot is refused") {
			return fmt.Errorf("no refusal in log yet")
		}
		return nil
	})
	time.Sleep(time.Second)
	if p, err := d.Plan(); err == nil {
		t.Errorf("a plan was served from a corrupt snapshot:\n%s", p.Text)
	}
}
