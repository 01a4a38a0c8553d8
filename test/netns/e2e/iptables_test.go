// Package e2e runs the built agent (bin/edgeproxy, mode iptables) inside a
// node network namespace against a real kube-apiserver, and checks real
// traffic from pod and client namespaces.
package e2e_test

import (
	"errors"
	"fmt"
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

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/internal/testkit/poll"
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

// waitFor polls fn until it returns nil, for at most d (poll.Until).
func waitFor(t *testing.T, d time.Duration, what string, fn func() error) {
	t.Helper()
	poll.Until(t, d, what, fn)
}

type agent struct {
	cmd *exec.Cmd
	log string
}

// apiAgentConfig writes, in a new directory, a kubeconfig for the API
// server of w and an iptables-mode agent config using it (state in
// dir/state, minPeriod 200ms) with extra YAML appended; it returns the
// directory and the config's path.
func apiAgentConfig(t *testing.T, w *apiWorld, extra string) (dir, cfg string) {
	t.Helper()
	dir = t.TempDir()
	kubeconfig := w.kubeconfig(t, dir)
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
	bin := rootAgent(t, "iptables", "iptables-restore")

	node := netns.NewNode(t, "node")
	a, b := node.AddPod("a"), node.AddPod("b")
	client := node.AddClient("client")
	serve(t, a, b)
	w := newAPIWorld(t, node, "e2e", 5*time.Minute)
	w.readyPod(t, "a", a, map[string]string{"app": "web"}, podPorts(true))
	vip := netip.MustParseAddr("10.96.100.10")
	svc := clusterIPService("web", vip, map[string]string{"app": "web"},
		servicePort("tcp", corev1.ProtocolTCP, 80, podPort), servicePort("udp", corev1.ProtocolUDP, 80, podPort))
	svc.Spec.Type = corev1.ServiceTypeNodePort
	for i := range svc.Spec.Ports {
		svc.Spec.Ports[i].NodePort = 30080
	}
	w.createService(t, svc)

	dir, cfg := apiAgentConfig(t, w, "")
	logPath := filepath.Join(dir, "agent.log")
	logOnFailure(t, node, "iptables-save")
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
	w.readyPod(t, "b", b, map[string]string{"app": "web"}, podPorts(true))
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
	if err := w.c.Client().CoreV1().Services(w.ns).Delete(w.ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRefused(t, client, netip.AddrPortFrom(node.LinkIP, 30080), "NodePort closed after delete")
}

// healthz asks the agent's health server inside the node.
func healthz(node *netns.Node) error {
	_, err := nodeGETWithin(node, "127.0.0.1:10256", "/healthz", 2*time.Second)
	return err
}
