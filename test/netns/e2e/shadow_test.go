package e2e_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/modules/modbuild"
)

// shadowWorld is a ClusterIP service whose two endpoints are pods a and b,
// annotated for the active weighted module (everything to a) and for the
// candidate (everything to b).
func shadowWorld(a, b netip.Addr) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: e2e
  annotations:
    edgeproxy.io/weights: "addr:%[1]s=1,default=0"
    edgeproxy.io/weights-next: "addr:%[2]s=1,default=0"
spec:
  clusterIP: 10.96.101.10
  clusterIPs: [10.96.101.10]
  ports: [{name: tcp, port: 80, protocol: TCP, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: e2e
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: tcp, port: 8080, protocol: TCP}]
endpoints:
  - {addresses: [%[1]s], nodeName: node1, conditions: {ready: true}}
  - {addresses: [%[2]s], nodeName: node1, conditions: {ready: true}}
`, a, b)
}

// TestIPTablesShadowPolicy: real connections through the kernel rules the
// agent programs. A candidate weighted module (reading another annotation:
// everything to b) and a module that spins run as shadows of the active
// one (everything to a): every connection still goes to a. Promoting the
// candidate by editing the config file sends every connection to b.
func TestIPTablesShadowPolicy(t *testing.T) {
	bin := rootAgent(t, "iptables", "iptables-restore")

	node := netns.NewNode(t, "node")
	a, b := node.AddPod("a"), node.AddPod("b")
	client := node.AddPod("c")
	serve(t, a, b)
	m := newManifestsAgent(t)
	dir := m.dir
	weighted, loop := filepath.Join(dir, "weighted.wasm"), filepath.Join(dir, "loop.wasm")
	for path, src := range map[string]string{weighted: "modules/weighted", loop: "modules/testdata/hostile/loop"} {
		if err := os.WriteFile(path, modbuild.Build(t, src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m.manifest(t, "web.yaml", shadowWorld(a.IP, b.IP))
	config := func(step, shadows string) string {
		return m.config(defaultSettings + fmt.Sprintf(`policy:
  engine: interpreter
  timeout: 500ms
  modules:
    - {name: weighted, path: %s}
%s
  chains:
    - name: web
      match: {namespaces: [e2e]}
      modules: [%s]
`, weighted, shadows, step))
	}
	cfg := m.cfg
	writeFile(t, cfg, config("{module: weighted}", fmt.Sprintf(`    - {name: weighted-next, path: %s, shadowOf: weighted, config: {annotation: edgeproxy.io/weights-next}}
    - {name: spin, path: %s, shadowOf: weighted, config: {only: e2e}}`, weighted, loop)))
	m.start(t, node, bin)

	vip := netip.AddrPortFrom(netip.MustParseAddr("10.96.101.10"), 80)
	count := func(n int) map[string]int {
		got := map[string]int{}
		for range n {
			r, err := client.TCP(vip, 2*time.Second)
			if err != nil {
				t.Fatalf("connection to %s: %v", vip, err)
			}
			got[r.Name]++
		}
		return got
	}
	waitFor(t, 60*time.Second, "the ClusterIP answered", func() error {
		_, err := client.TCP(vip, time.Second)
		return err
	})
	// The shadows run in the sync that programs the service.
	if got := count(200); got["a"] != 200 {
		t.Fatalf("with the shadows: %v over 200 connections, want all to a", got)
	}
	out, err := runIn(node, bin, "explain", "--server", "127.0.0.1:10249", "e2e/web")
	if err != nil {
		t.Fatalf("explain: %v\n%s", err, out)
	}
	for _, want := range []string{"shadow weighted-next (of weighted, never programmed): [0 1] differs", "shadow spin (of weighted, never programmed): FAILED"} {
		if !strings.Contains(out, want) {
			t.Fatalf("explain lacks %q:\n%s", want, out)
		}
	}

	// Promotion: the step runs the candidate with its config.
	writeFile(t, cfg, config("{module: weighted-next, config: {annotation: edgeproxy.io/weights-next}}",
		fmt.Sprintf(`    - {name: weighted-next, path: %s}`, weighted)))
	waitFor(t, 30*time.Second, "the promoted module's weights programmed", func() error {
		if r, err := client.TCP(vip, time.Second); err != nil || r.Name != "b" {
			return fmt.Errorf("answered by %+v (%v)", r, err)
		}
		return nil
	})
	if got := count(200); got["b"] != 200 {
		t.Fatalf("after the promotion: %v over 200 connections, want all to b", got)
	}
}
