package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/test/agenttest"
	"github.com/edgeproxy/edgeproxy/test/cluster"
)

// Issue 6 wants `edgeproxy status` to show module health and the snapshot
// age; the text output shows neither (Status.Modules is not rendered, and
// Status has no snapshot field at all).
func TestStatusShowsModulesAndSnapshot(t *testing.T) {
	mods := moduleDir(t)
	dir, _ := filepath.Abs(filepath.Join("testdata", "cli", "manifests"))
	a := agenttest.Start(t, agenttest.Options{Config: fmt.Sprintf(`mode: plan
manifests: %q
nodeName: edge-1
policy:
  engine: interpreter
  timeout: 500ms
  modules: [{name: weighted, path: %q}]
  chains: [{name: by-zone, match: {namespaces: [shop]}, modules: [{module: weighted}]}]
`, dir, filepath.Join(mods, "weighted.wasm"))})
	a.WaitPlanLines(converge, []string{"TCP  10.96.20.53:53 ClusterIP infra/resolver:dns-tcp -> 10.244.1.53:53 w=1"})
	out, _, _ := runCLI(t, "status", "--server="+a.Metrics)
	if !strings.Contains(out, "weighted") {
		t.Errorf("status does not show the health of module weighted:\n%s", out)
	}

	c := cluster.Shared(t)
	b := planAgent(t, c, "status-gap", "offline: {snapshotInterval: 0s}\n")
	b.WaitPlanLines(converge, nil)
	b.Eventually(converge, "snapshot written", func() error {
		if v, err := b.Metric("edgeproxy_snapshot_age_seconds"); err != nil || v < 0 {
			return fmt.Errorf("snapshot age %v %v", v, err)
		}
		return nil
	})
	out, _, _ = runCLI(t, "status", "--server="+b.Metrics)
	if !strings.Contains(strings.ToLower(out), "snapshot") {
		t.Errorf("status does not show the snapshot age:\n%s", out)
	}
}

// "API server last contact" is the time since the last watch event, not
// since the API server last answered: on a quiet cluster it grows while the
// connection is healthy, so it cannot tell a quiet cluster from a dead one.
func TestLastContactOnQuietCluster(t *testing.T) {
	c := cluster.Shared(t)
	a := planAgent(t, c, "quiet", "")
	a.WaitPlanLines(converge, nil)
	a.Eventually(converge, "first contact", func() error {
		if v, err := a.Metric("edgeproxy_apiserver_last_contact_seconds"); err != nil || v < 0 {
			return fmt.Errorf("%v %v", v, err)
		}
		return nil
	})
	// Prove the API server is up and the agent's watch healthy: the
	// apiserver answers, and nothing changes for 30 s. Without a heartbeat
	// last contact would be at least 30 s; with one (after 10 s of quiet,
	// checked every 3 s) it stays near 13 s, so 25 s leaves room for a slow
	// machine and still fails without it.
	time.Sleep(30 * time.Second)
	if _, err := c.Client().Discovery().ServerVersion(); err != nil {
		t.Fatal(err)
	}
	v, _ := a.Metric("edgeproxy_apiserver_last_contact_seconds")
	if v > 25 {
		t.Errorf("edgeproxy_apiserver_last_contact_seconds = %.0f with a healthy, quiet API connection", v)
	}
}
