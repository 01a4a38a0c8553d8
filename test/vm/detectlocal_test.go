package vm_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/vm"
	"github.com/edgeproxy/edgeproxy/test/agenttest"
	"github.com/edgeproxy/edgeproxy/test/cluster"
	g "github.com/edgeproxy/edgeproxy/test/vm/detectlocalguest"
)

// TestDetectLocalIPVS holds edgeproxy's IPVS mode to kube-proxy
// --proxy-mode=ipvs for each local-traffic detection setting, probe by
// probe, in one VM boot (the host's kernel has no IPVS): the guest half
// (test/vm/detectlocalguest) builds the node, runs both proxies and the
// probes and judges; this half runs the control plane and owns the API
// objects: the Node with its addresses and pod ranges in both families,
// the ready pod b and the dual-stack NodePort Service web on it, TCP and
// UDP. EDGEPROXY_VM_DETECT names the settings to run (comma-separated,
// default all).
func TestDetectLocalIPVS(t *testing.T) {
	gate.Root(t)
	if err := vm.Check(); err != nil {
		gate.Skip(t, err.Error())
	}
	kp, err := cluster.BinPath(cluster.KubeProxyBinary)
	if err != nil {
		gate.Skip(t, err.Error())
	}
	dir := t.TempDir()
	ep := filepath.Join(dir, "edgeproxy")
	if err := vm.CopyBinary(agenttest.Binary(t), ep); err != nil {
		t.Fatal(err)
	}
	c := cluster.New(t, cluster.Options{ExtraSANs: []string{"10.0.2.2"}, ServiceCIDR: g.ServiceCIDR})
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	for _, err := range []error{c.CreateNamespace(ctx, g.Namespace), c.EnsureDefaultServiceAccount(ctx, g.Namespace)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	n, err := c.CreateNode(ctx, g.NodeName, "zone-a", g.NodeIP.String(), g.NodeIP6.String())
	if err != nil {
		t.Fatal(err)
	}
	// This node's pod ranges, for NodeCIDR (kube-proxy waits for them).
	n.Spec.PodCIDR, n.Spec.PodCIDRs = g.PodCIDRs[0], g.PodCIDRs
	if _, err := c.Client().CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	ports := []corev1.ContainerPort{
		{Name: "tcp", ContainerPort: g.PodPort, Protocol: corev1.ProtocolTCP},
		{Name: "udp", ContainerPort: g.PodPort, Protocol: corev1.ProtocolUDP}}
	if _, err := c.CreateReadyPodIPs(ctx, g.Namespace, "b", g.NodeName, []string{g.BIPs[0].String(), g.BIPs[1].String()}, map[string]string{"app": "web"}, ports); err != nil {
		t.Fatal(err)
	}
	dual := corev1.IPFamilyPolicyRequireDualStack
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeNodePort, IPFamilyPolicy: &dual,
		ClusterIP: g.VIP.String(), ClusterIPs: []string{g.VIP.String(), g.VIP6.String()},
		IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
		Selector:   map[string]string{"app": "web"},
		Ports: []corev1.ServicePort{
			{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(g.PodPort), NodePort: g.NodePort},
			{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 80, TargetPort: intstr.FromInt32(g.PodPort), NodePort: g.NodePort}}}}
	if _, err := c.Client().CoreV1().Services(g.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteKubeconfig(filepath.Join(dir, "kubeconfig"), fmt.Sprintf("https://127.0.0.1:%d", c.Port())); err != nil {
		t.Fatal(err)
	}
	setup, err := json.Marshal(g.Setup{KubeProxy: kp, EdgeProxy: ep, APIPort: c.Port()})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "setup.json"), setup, 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	vm.RunGoTestsIn(t, dir, 35*time.Minute, vm.GoTest{Package: "./test/vm/detectlocalguest",
		Args:  []string{"-test.run=^TestDetectLocalIPVSGuest$", "-detect.dir=" + dir, "-detect.settings=" + os.Getenv("EDGEPROXY_VM_DETECT")},
		Check: guestPassed("TestDetectLocalIPVSGuest")})
	t.Logf("IPVS detect-local: %s in all (VM boot included)", time.Since(start).Round(time.Second))
}
