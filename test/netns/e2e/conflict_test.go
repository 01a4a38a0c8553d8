package e2e_test

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	edgeagent "github.com/edgeproxy/edgeproxy/agent"
	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// conflictWorld is two LoadBalancer Services whose status claims the same
// ingress IP:port (two controllers wrote it) and 100 good Services; good0
// is backed by the pod at ep.
func conflictWorld(ep netip.Addr) string {
	var b strings.Builder
	for _, s := range []struct{ ns, created, ip string }{{"old", "2023-01-01T00:00:00Z", "10.96.200.1"}, {"new", "2024-01-01T00:00:00Z", "10.96.200.2"}} {
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: Service
metadata: {name: lb, namespace: %s, creationTimestamp: %q}
spec: {type: LoadBalancer, clusterIP: %s, ports: [{port: 80}]}
status: {loadBalancer: {ingress: [{ip: 172.30.0.50}]}}
`, s.ns, s.created, s.ip)
	}
	for i := range 100 {
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Service\nmetadata: {name: good%d, namespace: t}\nspec: {clusterIP: 10.96.%d.%d, ports: [{port: 80}]}\n", i, 101+i/200, 1+i%200)
	}
	fmt.Fprintf(&b, `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: good0-1, namespace: t, labels: {kubernetes.io/service-name: good0}}
addressType: IPv4
ports: [{port: %d}]
endpoints: [{addresses: [%s], nodeName: %s}]
`, podPort, ep, nodeName)
	return b.String()
}

// Defect 1 of issue 14, end to end: with two Services claiming one
// frontend and 100 good ones, a change to a good Service reaches the
// kernel and `edgeproxy status` reports the conflict.
func TestIPTablesConflictDoesNotFreeze(t *testing.T) {
	bin := rootAgent(t, "iptables", "iptables-restore")

	node := netns.NewNode(t, "node")
	a, b := node.AddPod("a"), node.AddPod("b")
	serve(t, a, b)
	m := newManifestsAgent(t)
	world := m.manifest(t, "world.yaml", conflictWorld(a.IP))
	m.writeConfig(t, "clusterCIDR: 10.244.0.0/16\nsync: {minPeriod: 1s, period: 30s}\n")
	m.start(t, node, bin)

	vip := netip.AddrPortFrom(netip.MustParseAddr("10.96.101.1"), 80)
	answeredBy := func(want string) func() error {
		return func() error {
			r, err := b.TCP(vip, time.Second)
			if err == nil && r.Name != want {
				err = fmt.Errorf("answered by %s", r.Name)
			}
			return err
		}
	}
	waitFor(t, 60*time.Second, "good0 answered by a", answeredBy("a"))
	writeFile(t, world, conflictWorld(b.IP))
	waitFor(t, 30*time.Second, "good0 answered by b after the change", answeredBy("b"))

	out, err := runIn(node, bin, "status", "-o", "json")
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	var st edgeagent.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status -o json: %v\n%s", err, out)
	}
	var conflict bool
	for _, r := range st.Refused {
		conflict = conflict || (r.Conflict && r.Service == (datapath.ServicePortName{Namespace: "new", Name: "lb"}) && strings.Contains(r.Reason, "old/lb"))
	}
	if !conflict {
		t.Errorf("status does not report that new/lb lost 172.30.0.50:80 to old/lb: %+v", st.Refused)
	}
	if !st.Health.Healthy || st.Health.LastError != "" {
		t.Errorf("a conflict made the agent unhealthy: %+v", st.Health)
	}
	text, err := runIn(node, bin, "status")
	if err != nil || !strings.Contains(text, "new/lb TCP 172.30.0.50:80 LoadBalancer") {
		t.Errorf("status text does not show the conflict (%v):\n%s", err, text)
	}
}
