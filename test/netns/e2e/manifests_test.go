package e2e_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// writeFile replaces path atomically, as a config manager would.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

const nodeManifest = `apiVersion: v1
kind: Node
metadata:
  name: node1
  labels: {topology.kubernetes.io/zone: zone-a}
status:
  addresses: [{type: InternalIP, address: 192.168.77.1}]
`

// manifestDir makes dir/manifests holding this node's Node and returns it.
func manifestDir(t *testing.T, dir string) string {
	t.Helper()
	manifests := filepath.Join(dir, "manifests")
	if err := os.Mkdir(manifests, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(manifests, "node.yaml"), nodeManifest)
	return manifests
}

// webManifest is a NodePort service (TCP and UDP on one port) and a
// LoadBalancer service with externalTrafficPolicy Local, both backed by the
// pod at ip on node epNode.
func webManifest(ip netip.Addr, epNode string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: web, namespace: e2e}
spec:
  type: NodePort
  clusterIP: 10.96.100.10
  clusterIPs: [10.96.100.10]
  ports:
    - {name: tcp, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30080}
    - {name: udp, port: 80, protocol: UDP, targetPort: 8080, nodePort: 30080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: e2e
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports:
  - {name: tcp, port: 8080, protocol: TCP}
  - {name: udp, port: 8080, protocol: UDP}
endpoints:
  - addresses: [%[1]s]
    nodeName: node1
    conditions: {ready: true}
---
apiVersion: v1
kind: Service
metadata: {name: lb, namespace: e2e}
spec:
  type: LoadBalancer
  clusterIP: 10.96.100.20
  clusterIPs: [10.96.100.20]
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  ports:
    - {name: tcp, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30090}
status:
  loadBalancer:
    ingress: [{ip: 172.30.0.100}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: lb-1
  namespace: e2e
  labels: {kubernetes.io/service-name: lb}
addressType: IPv4
ports:
  - {name: tcp, port: 8080, protocol: TCP}
endpoints:
  - addresses: [%[1]s]
    nodeName: %[2]s
    conditions: {ready: true}
`, ip, epNode)
}

// healthCheck asks the healthCheckNodePort from the outside client.
func healthCheck(client *netns.NS, addr netip.AddrPort) (int, int, error) {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		Dial: func(network, a string) (c net.Conn, err error) {
			err = client.Do(func() error {
				c, err = net.DialTimeout(network, a, time.Second)
				return err
			})
			return c, err
		},
	}}
	resp, err := hc.Get("http://" + addr.String() + "/")
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	var body struct{ LocalEndpoints int }
	err = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body.LocalEndpoints, err
}

// TestIPTablesAgentManifests runs bin/edgeproxy on a manifest directory
// (no API server needed) and changes the manifests under it.
func TestIPTablesAgentManifests(t *testing.T) {
	bin := rootAgent(t, "iptables", "iptables-restore")

	node := netns.NewNode(t, "node")
	a, b := node.AddPod("a"), node.AddPod("b")
	client := node.AddClient("client")
	serve(t, a, b)
	m := newManifestsAgent(t)
	web := m.manifest(t, "web.yaml", webManifest(a.IP, nodeName))
	m.writeConfig(t, defaultSettings)
	logOnFailure(t, node, "iptables-save")
	ag := m.start(t, node, bin)

	vip := netip.AddrPortFrom(netip.MustParseAddr("10.96.100.10"), 80)
	waitFor(t, 60*time.Second, "b -> ClusterIP tcp answered by a", func() error {
		r, err := b.TCP(vip, time.Second)
		if err == nil && (r.Name != "a" || r.Client.Addr() != b.IP) {
			err = fmt.Errorf("got %+v", r)
		}
		return err
	})
	r, err := b.UDP(vip, 46000, 2*time.Second)
	if err != nil || r.Name != "a" {
		t.Fatalf("b -> ClusterIP udp from port 46000: %+v %v", r, err)
	}
	code, n, err := healthCheck(client, netip.AddrPortFrom(node.LinkIP, 32000))
	if err != nil || code != 200 || n != 1 {
		t.Fatalf("healthCheckNodePort with a local endpoint: %d, %d local, %v; want 200 and 1", code, n, err)
	}
	r, err = client.TCP(netip.AddrPortFrom(netip.MustParseAddr("172.30.0.100"), 80), 2*time.Second)
	if err != nil || r.Name != "a" || r.Client.Addr() != netip.MustParseAddr("192.168.77.2") {
		t.Fatalf("client -> Local LoadBalancer: %+v %v, want a seeing the client's address", r, err)
	}

	// The endpoint moves to pod b (and the LoadBalancer's to another node):
	// the UDP client on its fixed port is answered by b after the sync
	// (stale conntrack entry deleted), and the health check turns 503.
	writeFile(t, web, webManifest(b.IP, "node2"))
	waitFor(t, 30*time.Second, "UDP from the same port answered by the new pod", func() error {
		r, err := b.UDP(vip, 46000, time.Second)
		if err == nil && r.Name != "b" {
			err = fmt.Errorf("answered by %s", r.Name)
		}
		return err
	})
	waitFor(t, 30*time.Second, "healthCheckNodePort 503 without local endpoints", func() error {
		code, n, err := healthCheck(client, netip.AddrPortFrom(node.LinkIP, 32000))
		if err == nil && (code != 503 || n != 0) {
			err = fmt.Errorf("got %d with %d local endpoints", code, n)
		}
		return err
	})

	// SIGKILL and restart under a stream of connections: none fails.
	killRestartUnderStream(t, node, client, netip.AddrPortFrom(node.LinkIP, 30080), ag, bin, m.cfg, m.log)

	// The services go: the NodePort closes.
	if err := os.Remove(web); err != nil {
		t.Fatal(err)
	}
	waitRefused(t, client, netip.AddrPortFrom(node.LinkIP, 30080), "NodePort closed after the service is gone")
}
