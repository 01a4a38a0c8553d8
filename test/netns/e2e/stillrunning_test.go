package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	epagent "github.com/edgeproxy/edgeproxy/agent"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/test/cluster"
	"github.com/edgeproxy/edgeproxy/test/proxies"
)

// TestKubeProxyStillRunning starts edgeproxy on a node where kube-proxy
// (iptables mode, on other ports) still runs: edgeproxy removes its rules
// after its first sync, kube-proxy writes them again, and edgeproxy
// reports that once at its first look after the removal (a minute later)
// and removes nothing more. Connections to the Service, which both
// proxies program alike, never fail.
func TestKubeProxyStillRunning(t *testing.T) {
	gate.Root(t)
	gate.Binaries(t, "iptables-nft", "iptables-nft-restore", "iptables-nft-save", "nft")
	bin := agentBinary(t)
	kubeProxy, err := cluster.BinPath("kube-proxy")
	if err != nil {
		gate.Skip(t, fmt.Sprintf("needs the kube-proxy binary (make cluster-bins): %v", err))
	}
	node := netns.NewNode(t, "node")
	a := node.AddPod("a")
	if err := a.Serve(podPort); err != nil {
		t.Fatal(err)
	}
	client := node.AddClient("client") // gives the node its address
	// Ten thousand connections to one echo server: no stall from a tuple
	// still in TIME_WAIT may count as a failure of the proxies.
	for _, n := range []*netns.NS{node.NS, a.NS, client} {
		if err := n.NoTimeWait(); err != nil {
			t.Fatal(err)
		}
	}
	hostIP, _ := node.LinkHost()
	c := cluster.New(t, cluster.Options{BindAddress: hostIP.String()})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const ns = "still"
	for _, err := range []error{c.CreateNamespace(ctx, ns), c.EnsureDefaultServiceAccount(ctx, ns)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.CreateNode(ctx, nodeName, "zone-a", node.LinkIP.String()); err != nil {
		t.Fatal(err)
	}
	ports := []corev1.ContainerPort{{Name: "tcp", ContainerPort: podPort, Protocol: corev1.ProtocolTCP},
		{Name: "udp", ContainerPort: podPort, Protocol: corev1.ProtocolUDP}}
	if _, err := c.CreateReadyPod(ctx, ns, "a", nodeName, a.IP.String(), map[string]string{"app": "web"}, ports); err != nil {
		t.Fatal(err)
	}
	vip := netip.MustParseAddr("10.96.100.10")
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns}, Spec: corev1.ServiceSpec{
		ClusterIP: vip.String(), Selector: map[string]string{"app": "web"},
		Ports: []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(podPort)},
			{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 80, TargetPort: intstr.FromInt32(podPort)}}}}
	if _, err := c.Client().CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig, fmt.Sprintf("https://%s:%d", hostIP, c.Port())); err != nil {
		t.Fatal(err)
	}
	path, err := proxies.BackendPath(dir, "nft")
	if err != nil {
		t.Fatal(err)
	}
	settings := proxies.Settings{Backend: "nft", MinSync: 200 * time.Millisecond, Sync: 30 * time.Second, ClusterCIDR: "10.244.0.0/16"}
	// Other ports than edgeproxy's: with the same ones edgeproxy would
	// not start at all while kube-proxy runs.
	kpNode := proxies.Node{Name: nodeName, Kubeconfig: kubeconfig, MetricsAddr: "127.0.0.1:10349", HealthzAddr: "0.0.0.0:10356"}
	epNode := proxies.Node{Name: nodeName, Kubeconfig: kubeconfig, MetricsAddr: "127.0.0.1:10249", HealthzAddr: "0.0.0.0:10256"}
	cfg := filepath.Join(dir, "edgeproxy.yaml")
	if err := os.WriteFile(cfg, []byte(proxies.EdgeProxyConfig(epNode, settings, filepath.Join(dir, "state"))), 0o600); err != nil {
		t.Fatal(err)
	}
	start := func(name string, args ...string) *proxies.Process {
		t.Helper()
		logPath := filepath.Join(dir, name+".log")
		f, err := os.Create(logPath)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			f.Close()
			if t.Failed() {
				out, _ := os.ReadFile(logPath)
				t.Logf("%s log (tail):\n%s", name, tail(string(out), 60))
			}
		})
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Stdout, cmd.Stderr = f, f
		cmd.Env = proxies.Env(path)
		var p *proxies.Process
		if err := node.Do(func() (err error) { p, err = proxies.Start(name, cmd, logPath); return err }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Stop)
		return p
	}

	kp := start("kube-proxy", append([]string{kubeProxy}, proxies.KubeProxyArgs(kpNode, settings)...)...)
	waitFor(t, 3*time.Minute, "kube-proxy synced", func() error {
		if err := kp.Exited(); err != nil {
			t.Fatal(err)
		}
		body, err := nodeGET(node, kpNode.MetricsAddr, "/metrics")
		if err == nil && !kubeProxySyncedV4(body) {
			err = fmt.Errorf("not synced")
		}
		return err
	})

	// A stream of new connections from a pod on the node, for the whole
	// test (bounded in count and time).
	var okN, failN atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		deadline := time.Now().Add(5 * time.Minute)
		for i := 0; i < 60000 && time.Now().Before(deadline); i++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if _, err := a.TCP(netip.AddrPortFrom(vip, 80), 2*time.Second); err != nil {
				failN.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
			} else {
				okN.Add(1)
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	ep := start("edgeproxy", bin, "run", "--config", cfg)
	status := func() (*epagent.KubeProxyStatus, error) {
		if err := ep.Exited(); err != nil {
			t.Fatal(err)
		}
		body, err := nodeGET(node, epNode.MetricsAddr, "/debug/status")
		if err != nil {
			return nil, err
		}
		var st epagent.Status
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			return nil, err
		}
		if st.KubeProxy == nil {
			return nil, fmt.Errorf("no takeover yet")
		}
		return st.KubeProxy, nil
	}
	var st *epagent.KubeProxyStatus
	waitFor(t, 2*time.Minute, "edgeproxy took over", func() (err error) { st, err = status(); return err })
	if st.Removed.Chains() == 0 {
		t.Fatalf("edgeproxy removed nothing of the running kube-proxy's: %+v", st)
	}
	t.Logf("removed: %s", st.Removed)
	// kube-proxy writes its rules again (its canary chain is gone); the
	// first look, a minute after the removal, sees them.
	waitFor(t, 3*time.Minute, "edgeproxy saw kube-proxy's rules come back", func() error {
		st, err = status()
		if err == nil && len(st.Returned) == 0 {
			err = fmt.Errorf("not yet")
		}
		return err
	})
	t.Logf("returned: %s", st.Returned)
	if st.Removed.String() == "" || st.Returned.Chains() == 0 {
		t.Errorf("status %+v", st)
	}
	// Nothing more is removed: the rules kube-proxy wrote again stay.
	time.Sleep(2 * time.Second)
	out, err := node.Run("iptables-nft-save", "-t", "nat")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, ":KUBE-SERVICES") {
		t.Errorf("kube-proxy's rules gone again:\n%s", out)
	}
	logText, _ := os.ReadFile(ep.Log)
	if n := strings.Count(string(logText), "kube-proxy wrote its rules again"); n != 1 {
		t.Errorf("%d warnings that kube-proxy wrote its rules again, want 1", n)
	}
	repairs := strings.Count(string(logText), "repairing with a full sync")
	if f := failN.Load(); f != 0 {
		t.Errorf("%d of %d connections failed while both proxies ran: %v", f, f+okN.Load(), firstErr.Load())
	}
	t.Logf("%d connections while both proxies ran, %d failed; edgeproxy tamper repairs meanwhile: %d", okN.Load()+failN.Load(), failN.Load(), repairs)
}
