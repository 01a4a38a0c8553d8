// Package e2e runs the built agent (bin/edgeproxy, mode iptables) inside a
// node network namespace against a real kube-apiserver, and checks real
// traffic from pod and client namespaces.
package e2e_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/test/cluster"
)

const (
	nodeName = "node1"
	podPort  = 8080
)

func agentBinary(t *testing.T) string {
	p, err := filepath.Abs(filepath.Join("..", "..", "..", "bin", "edgeproxy"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		gate.Skip(t, "needs bin/edgeproxy (make build)")
	}
	return p
}

// waitFor polls fn every 200ms until it returns nil, for at most d.
func waitFor(t *testing.T, d time.Duration, what string, fn func() error) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if err = fn(); err == nil {
			return
		}
	}
	t.Fatalf("%s: not within %s: %v", what, d, err)
}

type agent struct {
	cmd *exec.Cmd
	log string
}

// apiAgentConfig writes, in a new directory, a kubeconfig for the API
// server of c on hostIP and an iptables-mode agent config using it (state
// in dir/state, minPeriod 200ms) with extra YAML appended; it returns the
// directory and the config's path.
func apiAgentConfig(t *testing.T, c *cluster.Cluster, hostIP netip.Addr, extra string) (dir, cfg string) {
	t.Helper()
	dir = t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig, fmt.Sprintf("https://%s:%d", hostIP, c.Port())); err != nil {
		t.Fatal(err)
	}
	cfg = filepath.Join(dir, "config.yaml")
	if !strings.Contains(extra, "sync:") {
		extra = "sync: {minPeriod: 200ms, period: 30s}\n" + extra
	}
	if err := os.WriteFile(cfg, fmt.Appendf(nil, `nodeName: %s
kubeconfig: %s
mode: iptables
clusterCIDR: 10.244.0.0/16
stateDir: %s
%s`, nodeName, kubeconfig, filepath.Join(dir, "state"), extra), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, cfg
}

// dumpedLogs holds the agent logs whose dump on failure is registered.
var dumpedLogs sync.Map

// startAgent runs the agent in node with its output appended to logPath,
// which the test prints if it fails.
func startAgent(t *testing.T, node *netns.Node, bin, cfg, logPath string) *agent {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if _, seen := dumpedLogs.LoadOrStore(logPath, true); !seen {
		t.Cleanup(func() { // once per log, however often the agent restarts
			if t.Failed() {
				out, _ := os.ReadFile(logPath)
				t.Logf("agent log:\n%s", out)
			}
		})
	}
	cmd := exec.Command(bin, "run", "--config", cfg)
	cmd.Stdout, cmd.Stderr = f, f
	if err := node.Start(t, cmd); err != nil {
		t.Fatal(err)
	}
	return &agent{cmd: cmd, log: logPath}
}

func TestIPTablesAgent(t *testing.T) {
	gate.Root(t)
	gate.Binaries(t, "iptables", "iptables-restore")
	bin := agentBinary(t)

	node := netns.NewNode(t, "node")
	a, b := node.AddPod("a"), node.AddPod("b")
	client := node.AddClient("client")
	for _, p := range []*netns.Pod{a, b} {
		if err := p.Serve(podPort); err != nil {
			t.Fatal(err)
		}
	}
	hostIP, _ := node.LinkHost()
	c := cluster.New(t, cluster.Options{BindAddress: hostIP.String()})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	const ns = "e2e"
	if err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if err := c.EnsureDefaultServiceAccount(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateNode(ctx, nodeName, "zone-a", node.LinkIP.String()); err != nil {
		t.Fatal(err)
	}
	ports := []corev1.ContainerPort{{Name: "tcp", ContainerPort: podPort, Protocol: corev1.ProtocolTCP}, {Name: "udp", ContainerPort: podPort, Protocol: corev1.ProtocolUDP}}
	if _, err := c.CreateReadyPod(ctx, ns, "a", nodeName, a.IP.String(), map[string]string{"app": "web"}, ports); err != nil {
		t.Fatal(err)
	}
	vip := netip.MustParseAddr("10.96.100.10")
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: corev1.ServiceSpec{
			Type:      corev1.ServiceTypeNodePort,
			ClusterIP: vip.String(),
			Selector:  map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{
				{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(podPort), NodePort: 30080},
				{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 80, TargetPort: intstr.FromInt32(podPort), NodePort: 30080},
			},
		},
	}
	if _, err := c.Client().CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	dir, cfg := apiAgentConfig(t, c, hostIP, "")
	logPath := filepath.Join(dir, "agent.log")
	t.Cleanup(func() {
		if t.Failed() {
			save, _ := node.Run("iptables-save")
			t.Logf("iptables-save in the node:\n%s", save)
		}
	})
	ag := startAgent(t, node, bin, cfg, logPath)

	// ClusterIP, TCP and UDP on the same port, source kept; NodePort from
	// outside, masqueraded.
	waitFor(t, 90*time.Second, "b -> ClusterIP tcp answered by a", func() error {
		r, err := b.TCP(netip.AddrPortFrom(vip, 80), time.Second)
		if err == nil && (r.Name != "a" || r.Client.Addr() != b.IP) {
			err = fmt.Errorf("got %+v", r)
		}
		return err
	})
	waitFor(t, 30*time.Second, "b -> ClusterIP udp", func() error {
		r, err := b.UDP(netip.AddrPortFrom(vip, 80), 0, time.Second)
		if err == nil && r.Name != "a" {
			err = fmt.Errorf("got %+v", r)
		}
		return err
	})
	waitFor(t, 30*time.Second, "client -> NodePort", func() error {
		r, err := client.TCP(netip.AddrPortFrom(node.LinkIP, 30080), time.Second)
		if err == nil && (r.Name != "a" || r.Client.Addr() != node.Gateway) {
			err = fmt.Errorf("got %+v, want a, masqueraded", r)
		}
		return err
	})

	// A second pod becomes ready: both answer.
	if _, err := c.CreateReadyPod(ctx, ns, "b", nodeName, b.IP.String(), map[string]string{"app": "web"}, ports); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "ClusterIP reaches pod b too", func() error {
		for range 20 {
			if r, err := client.TCP(netip.AddrPortFrom(node.LinkIP, 30080), time.Second); err == nil && r.Name == "b" {
				return nil
			}
		}
		return errors.New("only a answered")
	})

	// SIGKILL the agent while a client keeps connecting, start it again:
	// no connection fails (the rules stay; the new agent adopts them).
	killRestartUnderStream(t, node, client, netip.AddrPortFrom(node.LinkIP, 30080), ag, bin, cfg, logPath)

	// The service is deleted: its ClusterIP stops answering and its
	// NodePort closes.
	if err := c.Client().CoreV1().Services(ns).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRefused(t, client, netip.AddrPortFrom(node.LinkIP, 30080), "NodePort closed after delete")
}

// healthz asks the agent's health server inside the node.
func healthz(node *netns.Node) error {
	var conn net.Conn
	if err := node.Do(func() (err error) {
		conn, err = net.DialTimeout("tcp", "127.0.0.1:10256", time.Second)
		return err
	}); err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write([]byte("GET /healthz HTTP/1.0\r\n\r\n")); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthz: %s", resp.Status)
	}
	return nil
}
