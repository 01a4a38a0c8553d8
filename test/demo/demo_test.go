// Package demo is `make demo`'s second half: edgeproxy programs a throwaway
// network namespace from manifests and a request through a ClusterIP is
// answered by a pod. Run it with -v to see the story.
package demo

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/test/agenttest"
)

func TestDemo(t *testing.T) {
	gate.Root(t)
	gate.Binaries(t, "iptables", "iptables-restore")
	bin := agenttest.Binary(t)

	node := netns.NewNode(t, "demo")
	a, b := node.AddPod("web-a"), node.AddPod("web-b")
	client := node.AddPod("client")
	for _, p := range []*netns.Pod{a, b} {
		if err := p.Serve(8080); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("node namespace with pods web-a (%s), web-b (%s) and client (%s)", a.IP, b.IP, client.IP)

	dir := t.TempDir()
	manifests := filepath.Join(dir, "manifests")
	if err := os.Mkdir(manifests, 0o755); err != nil {
		t.Fatal(err)
	}
	svc := fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  clusterIP: 10.96.0.20
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: demo, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
  - {addresses: [%s], nodeName: demo-node}
  - {addresses: [%s], nodeName: demo-node}
`, a.IP, b.IP)
	if err := os.WriteFile(filepath.Join(manifests, "web.yaml"), []byte(svc), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`nodeName: demo-node
manifests: %s
mode: iptables
clusterCIDR: 10.244.0.0/16
stateDir: %s
server: {healthz: "", metrics: ""}
sync: {minPeriod: 100ms}
`, manifests, filepath.Join(dir, "state"))), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "run", "--config", cfg)
	log := filepath.Join(dir, "agent.log")
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd.Stdout, cmd.Stderr = f, f
	if err := node.Start(t, cmd); err != nil {
		t.Fatal(err)
	}
	t.Logf("edgeproxy runs in the node namespace (mode iptables) on the manifests")

	vip := netip.MustParseAddrPort("10.96.0.20:80")
	seen := map[string]int{}
	deadline := time.Now().Add(60 * time.Second)
	for len(seen) < 2 && time.Now().Before(deadline) {
		r, err := client.TCP(vip, time.Second)
		if err != nil {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		if seen[r.Name] == 0 {
			t.Logf("client -> %s answered by pod %s, which saw the client as %s", vip, r.Name, r.Client.Addr())
		}
		seen[r.Name]++
	}
	if len(seen) < 2 {
		out, _ := os.ReadFile(log)
		save, _ := node.Run("iptables-save", "-t", "nat")
		t.Fatalf("requests to %s reached %v, want both pods\nagent log:\n%s\nnat table:\n%s", vip, seen, out, save)
	}
	save, _ := node.Run("iptables-save", "-t", "nat")
	t.Logf("the nat rules edgeproxy wrote:\n%s", save)
	t.Logf("cleaning up: the namespaces and the agent go away with the test")
}
