package e2e_test

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/test/cluster"
	"github.com/edgeproxy/edgeproxy/test/proxies"
)

// The worlds the tests here share: an agent reading a manifest directory,
// or a real API server on the node's link; the pods' servers; the agent's
// or a proxy's process with its log; a stream of connections.

// serve starts the echo server on podPort in every pod.
func serve(t *testing.T, pods ...*netns.Pod) {
	t.Helper()
	for _, p := range pods {
		if err := p.Serve(podPort); err != nil {
			t.Fatal(err)
		}
	}
}

// logOnFailure prints what the command prints in node when t fails.
func logOnFailure(t *testing.T, node *netns.Node, name string, args ...string) {
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := node.Run(name, args...)
			t.Logf("%s in the node:\n%s", strings.Join(append([]string{name}, args...), " "), out)
		}
	})
}

// manifestsAgent is an agent's directory when it reads manifests: the
// manifests in manifests (this node's Node in node.yaml), its config file
// cfg, its state in dir/state and its log in log.
type manifestsAgent struct {
	dir, manifests, cfg, log string
}

// defaultSettings are the settings most tests run the agent with.
const defaultSettings = "clusterCIDR: 10.244.0.0/16\nsync: {minPeriod: 200ms, period: 30s}\n"

func newManifestsAgent(t *testing.T) *manifestsAgent {
	t.Helper()
	dir := t.TempDir()
	return &manifestsAgent{dir: dir, manifests: manifestDir(t, dir), cfg: filepath.Join(dir, "config.yaml"), log: filepath.Join(dir, "agent.log")}
}

// config is an iptables-mode config for this node that reads m's
// manifests and keeps its state in dir/state, followed by settings
// (YAML lines).
func (m *manifestsAgent) config(settings string) string {
	return fmt.Sprintf("nodeName: %s\nmanifests: %s\nmode: iptables\nstateDir: %s\n%s", nodeName, m.manifests, filepath.Join(m.dir, "state"), settings)
}

// writeConfig writes m.config(settings) as the agent's config file.
func (m *manifestsAgent) writeConfig(t *testing.T, settings string) {
	t.Helper()
	writeFile(t, m.cfg, m.config(settings))
}

// manifest writes content as the manifest file name and returns its path.
func (m *manifestsAgent) manifest(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(m.manifests, name)
	writeFile(t, path, content)
	return path
}

// start runs the agent with m's config in node.
func (m *manifestsAgent) start(t *testing.T, node *netns.Node, bin string) *agent {
	t.Helper()
	return startAgent(t, node, bin, m.cfg, m.log)
}

// apiWorld is a real API server on the host side of a node's link (at
// hostIP), a namespace ns for the test's objects and this node's Node.
// Its calls are bounded by ctx, which ends with the test.
type apiWorld struct {
	c      *cluster.Cluster
	ctx    context.Context
	hostIP netip.Addr
	ns     string
}

// newAPIWorld starts the API server for node and creates namespace ns
// (unless "") and the Node nodeName; ctx ends after timeout. The Node's InternalIP is
// the node's address on its client link when it has a client (the
// address the client sees), else on the API server's link.
func newAPIWorld(t *testing.T, node *netns.Node, ns string, timeout time.Duration) *apiWorld {
	t.Helper()
	hostIP, nodeIP := node.LinkHost()
	if node.LinkIP.IsValid() {
		nodeIP = node.LinkIP
	}
	c := cluster.New(t, cluster.Options{BindAddress: hostIP.String()})
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	if ns != "" {
		if err := c.CreateNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.CreateNode(ctx, nodeName, "zone-a", nodeIP.String()); err != nil {
		t.Fatal(err)
	}
	return &apiWorld{c: c, ctx: ctx, hostIP: hostIP, ns: ns}
}

// readyPod creates the ready Pod name at p's address on this node.
func (w *apiWorld) readyPod(t *testing.T, name string, p *netns.Pod, labels map[string]string, ports []corev1.ContainerPort) {
	t.Helper()
	if _, err := w.c.CreateReadyPod(w.ctx, w.ns, name, nodeName, p.IP.String(), labels, ports); err != nil {
		t.Fatal(err)
	}
}

// createService creates svc in w's namespace.
func (w *apiWorld) createService(t *testing.T, svc *corev1.Service) {
	t.Helper()
	svc.Namespace = w.ns
	if _, err := w.c.Client().CoreV1().Services(w.ns).Create(w.ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// kubeconfig writes, in dir, a kubeconfig for the API server as the node
// reaches it and returns its path.
func (w *apiWorld) kubeconfig(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "kubeconfig")
	if err := w.c.WriteKubeconfig(path, fmt.Sprintf("https://%s:%d", w.hostIP, w.c.Port())); err != nil {
		t.Fatal(err)
	}
	return path
}

// clusterIPService is Service name at vip selecting selector, with ports.
func clusterIPService(name string, vip netip.Addr, selector map[string]string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{ClusterIP: vip.String(), Selector: selector, Ports: ports}}
}

// servicePort is port name (proto, port) to target on the pods.
func servicePort(name string, proto corev1.Protocol, port, target int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: proto, Port: port, TargetPort: intstr.FromInt32(target)}
}

// podPorts are a pod's container ports on podPort: "tcp", and "udp" too
// when udp.
func podPorts(udp bool) []corev1.ContainerPort {
	ports := []corev1.ContainerPort{{Name: "tcp", ContainerPort: podPort, Protocol: corev1.ProtocolTCP}}
	if udp {
		ports = append(ports, corev1.ContainerPort{Name: "udp", ContainerPort: podPort, Protocol: corev1.ProtocolUDP})
	}
	return ports
}

// startProxy runs args (a proxy: edgeproxy or kube-proxy) in node with
// the iptables tools of proxies.Env(toolPath), its output appended to
// logPath, whose tail is printed if t fails. It is stopped when t ends.
func startProxy(t *testing.T, node *netns.Node, name, logPath, toolPath string, args ...string) *proxies.Process {
	t.Helper()
	return proxies.StartLogged(t, node.Do, name, logPath, proxies.Env(toolPath), args...)
}

// waitKubeProxySynced waits until kube-proxy p, serving its metrics at
// metricsAddr in node, has finished an IPv4 sync and the conntrack sweep
// after it (set after the sync's timestamp in pkg/proxy/iptables and
// nftables syncProxyRules; the first sync of UDP Services always sweeps);
// it fails t if p exits.
func waitKubeProxySynced(t *testing.T, node *netns.Node, p *proxies.Process, metricsAddr, what string) {
	t.Helper()
	waitFor(t, 3*time.Minute, what, func() error {
		if err := p.Exited(); err != nil {
			t.Fatal(err)
		}
		body, err := nodeGET(node, metricsAddr, "/metrics")
		if err != nil {
			return err
		}
		if !(proxies.Nonzero(body, proxies.MetricSyncTimestamp, "IPv4") && proxies.Nonzero(body, proxies.MetricConntrackSwept, "IPv4")) {
			return fmt.Errorf("no finished IPv4 sync and conntrack sweep in kube-proxy's metrics")
		}
		return nil
	})
}

// nodeGET fetches path from addr inside the node namespace.
func nodeGET(node *netns.Node, addr, path string) (string, error) {
	return nodeGETWithin(node, addr, path, 5*time.Second)
}

// nodeGETWithin fetches path from addr inside the node namespace, the
// exchange bounded by d; an answer other than 200 is an error.
func nodeGETWithin(node *netns.Node, addr, path string, d time.Duration) (string, error) {
	return node.GET(addr, path, d)
}

// connStream is a bounded stream of new TCP connections from a client to
// one destination, counted.
type connStream struct {
	ok, failed atomic.Int64
	firstErr   atomic.Value // the first failure's error
	stopc      chan struct{}
	wg         sync.WaitGroup
}

// startStream connects from client to dst, one connection every pause
// (back to back without one), at most n times or for d, until stop.
func startStream(client *netns.NS, dst netip.AddrPort, pause time.Duration, n int, d time.Duration) *connStream {
	s := &connStream{stopc: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		deadline := time.Now().Add(d)
		for i := 0; i < n && time.Now().Before(deadline); i++ {
			if pause > 0 {
				select {
				case <-s.stopc:
					return
				case <-time.After(pause):
				}
			} else {
				select {
				case <-s.stopc:
					return
				default:
				}
			}
			if _, err := client.TCP(dst, 2*time.Second); err != nil {
				s.failed.Add(1)
				s.firstErr.CompareAndSwap(nil, err.Error())
			} else {
				s.ok.Add(1)
			}
		}
	}()
	return s
}

// stop ends the stream and waits for its last connection.
func (s *connStream) stop() {
	close(s.stopc)
	s.wg.Wait()
}

// rootAgent skips t unless it runs as root with tools, and returns the
// agent binary.
func rootAgent(t *testing.T, tools ...string) string {
	t.Helper()
	gate.Root(t)
	gate.Binaries(t, tools...)
	return agentBinary(t)
}

// kubeProxyBinary returns the kube-proxy binary, or skips t without it.
func kubeProxyBinary(t *testing.T) string {
	t.Helper()
	p, err := cluster.BinPath("kube-proxy")
	if err != nil {
		gate.Skip(t, fmt.Sprintf("needs the kube-proxy binary (make cluster-bins): %v", err))
	}
	return p
}

// kill ends the agent by SIGKILL, as a crash or a power cut would, and
// waits for it.
func (a *agent) kill(t *testing.T) {
	t.Helper()
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = a.cmd.Wait()
}

// flushRules runs `edgeproxy cleanup` with cfg in node: every rule the
// agent made goes, as in a reboot.
func flushRules(t *testing.T, node *netns.Node, bin, cfg string) {
	t.Helper()
	if out, err := runIn(node, bin, "cleanup", "--config", cfg); err != nil {
		t.Fatalf("edgeproxy cleanup: %v\n%s", err, out)
	}
}

// tcpServiceManifest is ClusterIP Service e2e/name at vip, TCP port 80
// to podPort on the ready pod at ep on this node, and its EndpointSlice.
func tcpServiceManifest(name string, vip, ep netip.Addr) string {
	family := "IPv4"
	if vip.Is6() {
		family = "IPv6"
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: e2e}
spec:
  clusterIP: %[2]s
  clusterIPs: [%[2]s]
  ipFamilies: [%[3]s]
  ports: [{name: tcp, port: 80, protocol: TCP, targetPort: %[5]d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %[1]s-1, namespace: e2e, labels: {kubernetes.io/service-name: %[1]s}}
addressType: %[3]s
ports: [{name: tcp, port: %[5]d, protocol: TCP}]
endpoints: [{addresses: [%[4]s], nodeName: %[6]s, conditions: {ready: true}}]
`, name, vip, family, ep, podPort, nodeName)
}
