package fault

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/edgeproxy/edgeproxy/datapath/iptables"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/test/agenttest"
	"github.com/edgeproxy/edgeproxy/test/cluster"
)

const relistRestarts = 3

// A relist storm: the API server restarts again and again (each restart
// drops every watch; the informers relist, and a resourceVersion the new
// watch cache no longer has is answered 410 Gone and relisted). The rules
// are never flushed (the Service answers during every outage), a change
// made between restarts is programmed, and full syncs stay bounded: the
// relists do not force one each (the count is at most one per restart
// plus the first).
func TestAPIServerRelistStorm(t *testing.T) {
	gate.Root(t)
	gate.Binaries(t, "iptables", "iptables-restore", "iptables-save")
	node := netns.NewNode(t, "relist")
	a, b, client := node.AddPod("a"), node.AddPod("b"), node.AddPod("client")
	for _, p := range []*netns.Pod{a, b} {
		if err := p.Serve(podPort); err != nil {
			t.Fatal(err)
		}
	}
	hostIP, nodeIP := node.LinkHost()
	c := cluster.New(t, cluster.Options{BindAddress: hostIP.String()})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const ns, nodeName = "relist", "node1"
	if err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateNode(ctx, nodeName, "zone-a", nodeIP.String()); err != nil {
		t.Fatal(err)
	}
	ports := []corev1.ContainerPort{{Name: "tcp", ContainerPort: podPort, Protocol: corev1.ProtocolTCP}}
	labels := map[string]string{"app": "web"}
	if _, err := c.CreateReadyPod(ctx, ns, "a", nodeName, a.IP.String(), labels, ports); err != nil {
		t.Fatal(err)
	}
	vip := netip.MustParseAddr("10.96.102.10")
	if _, err := c.Client().CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: corev1.ServiceSpec{ClusterIP: vip.String(), Selector: labels,
			Ports: []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(podPort)}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig, fmt.Sprintf("https://%s:%d", hostIP, c.Port())); err != nil {
		t.Fatal(err)
	}
	// Served on the node's link address: the test, outside the namespace,
	// reads /metrics there.
	healthz, metrics := netip.AddrPortFrom(nodeIP, 10256).String(), netip.AddrPortFrom(nodeIP, 10249).String()
	ag := agenttest.Start(t, agenttest.Options{NetNS: node.Name, Healthz: healthz, Metrics: metrics, Config: fmt.Sprintf(`nodeName: %s
kubeconfig: %s
mode: iptables
clusterCIDR: 10.244.0.0/16
stateDir: %s
sync: {minPeriod: 200ms, period: 1h}
server: {healthz: %q, metrics: %q}
`, nodeName, kubeconfig, filepath.Join(dir, "state"), healthz, metrics)})

	answeredBy := func(want string) error {
		r, err := client.TCP(netip.AddrPortFrom(vip, 80), time.Second)
		if err == nil && r.Name != want {
			err = fmt.Errorf("answered by %q, want %q", r.Name, want)
		}
		return err
	}
	ag.Eventually(60*time.Second, "the Service answers from a", func() error { return answeredBy("a") })
	fullSyncs := func() float64 {
		t.Helper()
		n, err := ag.Metric(iptables.MetricFullDuration + "_count")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := fullSyncs()
	if before < 1 {
		t.Fatalf("%s_count = %v before the storm; the first sync is a full one", iptables.MetricFullDuration, before)
	}

	for i := range relistRestarts {
		if err := c.StopAPIServer(); err != nil {
			t.Fatal(err)
		}
		if err := answeredBy("a"); err != nil {
			t.Fatalf("restart %d: the Service stopped answering while the API server was away: %v", i, err)
		}
		if err := c.StartAPIServer(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A change after the storm reaches the kernel: pod a goes, pod b comes.
	if _, err := c.CreateReadyPod(ctx, ns, "b", nodeName, b.IP.String(), labels, ports); err != nil {
		t.Fatal(err)
	}
	if err := c.SetPodReady(ctx, ns, "a", false); err != nil {
		t.Fatal(err)
	}
	// The controller manager's part first, on its own bound.
	for ip, ready := range map[string]bool{b.IP.String(): true, a.IP.String(): false} {
		if err := c.WaitSliceReady(ctx, ns, "web", ip, ready, 3*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	ag.Eventually(60*time.Second, "the Service answers from b after the storm", func() error { return answeredBy("b") })
	if n := fullSyncs() - before; n > relistRestarts {
		t.Errorf("%v full syncs for %d API server restarts; want at most one each", n, relistRestarts)
	} else {
		t.Logf("%v full syncs for %d API server restarts", n, relistRestarts)
	}
}
