package vm_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/vm"
	"github.com/edgeproxy/edgeproxy/test/agenttest"
	"github.com/edgeproxy/edgeproxy/test/cluster"
	"github.com/edgeproxy/edgeproxy/test/vm/switchguest"
)

// TestSwitchKubeProxyIPVS is the switch between kube-proxy's IPVS mode and
// edgeproxy's on a live node, both ways, then to edgeproxy's iptables
// mode, in one VM boot: the guest half (test/vm/switchguest) builds the
// node, runs the proxies and the traffic and judges; this half runs the
// control plane (TCG is too slow for it), owns the API objects, and
// deletes and re-creates pod c when the guest asks (a file in the shared
// directory: switchguest.Request).
func TestSwitchKubeProxyIPVS(t *testing.T) {
	gate.Root(t)
	kp, err := cluster.BinPath(cluster.KubeProxyBinary)
	if err != nil {
		gate.Skip(t, err.Error())
	}
	runSwitchGuest(t, "TestSwitchKubeProxyIPVSGuest", kp)
}

// TestSwitchNFTablesIPVS is the switch between edgeproxy's nftables and
// IPVS modes on a live node, both ways, in one VM boot (the only place
// with IPVS): the guest half is switchguest's TestSwitchNFTablesIPVSGuest,
// this half is TestSwitchKubeProxyIPVS's.
func TestSwitchNFTablesIPVS(t *testing.T) {
	gate.Root(t)
	runSwitchGuest(t, "TestSwitchNFTablesIPVSGuest", "")
}

// runSwitchGuest runs the control plane and the switch world's API
// objects, boots the VM into the guest test named guest with the world's
// setup (kube-proxy's binary kp, if the guest runs it), and serves the
// guest's requests until it is done.
func runSwitchGuest(t *testing.T, guest, kp string) {
	t.Helper()
	if err := vm.Check(); err != nil {
		gate.Skip(t, err.Error())
	}
	dir := t.TempDir()
	ep := filepath.Join(dir, "edgeproxy")
	if err := vm.CopyBinary(agenttest.Binary(t), ep); err != nil {
		t.Fatal(err)
	}
	c := cluster.New(t, cluster.Options{ExtraSANs: []string{"10.0.2.2"}})
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	const ns = switchguest.Namespace
	for _, err := range []error{c.CreateNamespace(ctx, ns), c.EnsureDefaultServiceAccount(ctx, ns)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.CreateNode(ctx, switchguest.NodeName, "zone-a", switchguest.NodeIP.String()); err != nil {
		t.Fatal(err)
	}
	addPod := func(ctx context.Context, name string) error {
		labels := map[string]string{"app": "web"}
		if name != "c" {
			labels["steady"] = "yes"
		}
		ports := []corev1.ContainerPort{
			{Name: "tcp", ContainerPort: switchguest.PodPort, Protocol: corev1.ProtocolTCP},
			{Name: "udp", ContainerPort: switchguest.PodPort, Protocol: corev1.ProtocolUDP},
			{Name: "held", ContainerPort: switchguest.HeldPort, Protocol: corev1.ProtocolTCP}}
		_, err := c.CreateReadyPod(ctx, ns, name, switchguest.NodeName, switchguest.PodIPs[name].String(), labels, ports)
		return err
	}
	for _, name := range []string{"a", "b", "c"} {
		if err := addPod(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	tcpUDP := func(port int32, target int32) []corev1.ServicePort {
		return []corev1.ServicePort{
			{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: port, TargetPort: intstr.FromInt32(target)},
			{Name: "udp", Protocol: corev1.ProtocolUDP, Port: port, TargetPort: intstr.FromInt32(target)}}
	}
	for _, svc := range []*corev1.Service{
		{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.ServiceSpec{ClusterIP: switchguest.WebVIP.String(),
			Selector: map[string]string{"app": "web"}, Ports: tcpUDP(80, switchguest.PodPort)}},
		{ObjectMeta: metav1.ObjectMeta{Name: "steady"}, Spec: corev1.ServiceSpec{ClusterIP: switchguest.SteadyVIP.String(),
			Selector: map[string]string{"steady": "yes"}, Ports: []corev1.ServicePort{
				{Name: "held", Protocol: corev1.ProtocolTCP, Port: switchguest.HeldPort, TargetPort: intstr.FromInt32(switchguest.HeldPort)},
				{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 80, TargetPort: intstr.FromInt32(switchguest.PodPort)}}}},
		// kube-proxy serves externalIPs; edgeproxy leaves them off by
		// default: what kube-proxy's leftovers would go on answering.
		{ObjectMeta: metav1.ObjectMeta{Name: "ext"}, Spec: corev1.ServiceSpec{ClusterIP: switchguest.ExtVIP.String(),
			ExternalIPs: []string{switchguest.ExternalIP.String()},
			Selector:    map[string]string{"steady": "yes"}, Ports: tcpUDP(80, switchguest.PodPort)[:1]}},
	} {
		if _, err := c.Client().CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.WriteKubeconfig(filepath.Join(dir, "kubeconfig"), fmt.Sprintf("https://127.0.0.1:%d", c.Port())); err != nil {
		t.Fatal(err)
	}
	setup, err := json.Marshal(switchguest.Setup{KubeProxy: kp, EdgeProxy: ep, APIPort: c.Port()})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "setup.json"), setup, 0o644); err != nil {
		t.Fatal(err)
	}

	// Serve the guest's requests until the VM is done. Not within ctx's
	// 25 minutes: the VM may first wait that long for another's to end
	// (vm.Run's lock; 30 minutes once), and a request then found the
	// host gone. The VM run bounds it.
	serving, stop := context.WithCancel(context.Background())
	defer stop()
	served := make(chan struct{})
	go func() {
		defer close(served)
		switchguest.Serve(serving, dir, func(r switchguest.Request) error {
			switch r.Op {
			case "delete":
				return switchguest.DeletePod(serving, c.Client(), ns, r.Pod)
			case "add":
				return addPod(serving, r.Pod)
			}
			return fmt.Errorf("unknown request %q", r.Op)
		})
	}()
	start := time.Now()
	vm.RunGoTestsIn(t, dir, 15*time.Minute, vm.GoTest{Package: "./test/vm/switchguest",
		Args:  []string{"-test.run=^" + guest + "$", "-switch.dir=" + dir},
		Check: guestPassed(guest)})
	stop()
	<-served
	t.Logf("%s: %s in all (VM boot included)", guest, time.Since(start).Round(time.Second))
}

// guestPassed checks that the guest test ran and passed: a skip, or a
// -test.run that matched nothing, also exits 0.
func guestPassed(name string) func([]byte) error {
	return func(out []byte) error {
		if !strings.Contains(string(out), "--- PASS: "+name+" ") {
			return fmt.Errorf("%s did not run and pass in the guest", name)
		}
		return nil
	}
}
