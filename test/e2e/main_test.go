// Package e2e runs the real edgeproxy binary against a real kube-apiserver
// (with etcd and the EndpointSlice controllers) or a manifest directory, and
// checks the plan it computes. Traffic tests live with the datapaths.
package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/edgeproxy/edgeproxy/test/agenttest"
	"github.com/edgeproxy/edgeproxy/test/cluster"
)

func TestMain(m *testing.M) { os.Exit(cluster.RunShared(m)) }

// converge bounds every wait for the agent to catch up with a change.
const converge = 30 * time.Second

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// planAgent starts edgeproxy in plan mode against c, as node nodeName.
func planAgent(t *testing.T, c *cluster.Cluster, nodeName, extra string) *agenttest.Agent {
	t.Helper()
	kc := t.TempDir() + "/kubeconfig"
	if err := c.WriteKubeconfig(kc, c.URL); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(extra, "sync:") {
		extra += "\nsync: {minPeriod: 100ms, period: 30s}\n"
	}
	return agenttest.Start(t, agenttest.Options{Config: fmt.Sprintf(`
mode: plan
kubeconfig: %q
nodeName: %q
stateDir: %q
%s`, kc, nodeName, t.TempDir(), extra)})
}

type svcOpt func(*corev1.Service)

func service(ns, name, clusterIP string, ports []corev1.ServicePort, opts ...svcOpt) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			ClusterIP: clusterIP, Ports: ports, Selector: map[string]string{"app": name},
		},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func tcp(name string, port int32, target intstr.IntOrString) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Port: port, TargetPort: target, Protocol: corev1.ProtocolTCP}
}

func udp(name string, port int32, target intstr.IntOrString) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Port: port, TargetPort: target, Protocol: corev1.ProtocolUDP}
}

func create(t *testing.T, client kubernetes.Interface, s *corev1.Service) *corev1.Service {
	t.Helper()
	out, err := client.CoreV1().Services(s.Namespace).Create(ctxFor(t), s, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create service %s/%s: %v", s.Namespace, s.Name, err)
	}
	return out
}

func pod(t *testing.T, c *cluster.Cluster, ns, name, node, ip, app string, ports ...corev1.ContainerPort) {
	t.Helper()
	if _, err := c.CreateReadyPod(ctxFor(t), ns, name, node, ip, map[string]string{"app": app}, ports); err != nil {
		t.Fatal(err)
	}
}

func node(t *testing.T, c *cluster.Cluster, name, zone, ip string) {
	t.Helper()
	if _, err := c.CreateNode(ctxFor(t), name, zone, ip); err != nil {
		t.Fatal(err)
	}
}

func ptr[T any](v T) *T { return &v }

// slice builds an EndpointSlice that no controller manages, for the cases
// the controller never writes (terminating endpoints on demand, several
// slices, bad objects).
func slice(ns, name, svc string, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	labels := map[string]string{discoveryv1.LabelManagedBy: "e2e.edgeproxy.io"}
	if svc != "" {
		labels[discoveryv1.LabelServiceName] = svc
	}
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       ports,
		Endpoints:   eps,
	}
}

func endpoint(ip, node string, ready, serving, terminating bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses: []string{ip}, NodeName: ptr(node),
		Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready), Serving: ptr(serving), Terminating: ptr(terminating)},
	}
}

func epPort(name string, port int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr(name), Port: ptr(port), Protocol: ptr(corev1.ProtocolTCP)}
}
