package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/edgeproxy/edgeproxy/test/cluster"
)

func TestMain(m *testing.M) { os.Exit(cluster.RunShared(m)) }

// wait bounds every "eventually" in these tests; the controller usually
// needs well under a second.
const wait = 30 * time.Second

// createWebService creates Service ns/web selecting app=web, port 80 to the
// named container port "http".
func createWebService(ctx context.Context, t *testing.T, client kubernetes.Interface, ns string) {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromString("http"),
			}},
		},
	}
	if _, err := client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service: %v", err)
	}
}

var webPorts = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}

// endpointOf returns the endpoint with address addr among the
// EndpointSlices of Service ns/svc, with the slice's port list.
func endpointOf(ctx context.Context, client kubernetes.Interface, ns, svc, addr string) (*discoveryv1.Endpoint, []discoveryv1.EndpointPort, error) {
	slices, err := client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=" + svc,
	})
	if err != nil {
		return nil, nil, err
	}
	for _, s := range slices.Items {
		for i, ep := range s.Endpoints {
			for _, a := range ep.Addresses {
				if a == addr {
					return &s.Endpoints[i], s.Ports, nil
				}
			}
		}
	}
	return nil, nil, nil
}

// waitEndpoint waits until the endpoint addr of ns/svc exists and its Ready
// condition is ready, and returns it.
func waitEndpoint(ctx context.Context, t *testing.T, client kubernetes.Interface, ns, svc, addr string, ready bool) (*discoveryv1.Endpoint, []discoveryv1.EndpointPort) {
	t.Helper()
	var (
		ep    *discoveryv1.Endpoint
		ports []discoveryv1.EndpointPort
		seen  string
	)
	err := cluster.WaitFor(ctx, wait, func(ctx context.Context) (bool, error) {
		var err error
		ep, ports, err = endpointOf(ctx, client, ns, svc, addr)
		if err != nil {
			seen = err.Error()
			return false, nil
		}
		if ep == nil {
			seen = "no endpoint"
			return false, nil
		}
		seen = fmt.Sprintf("endpoint %+v", *ep)
		return ep.Conditions.Ready != nil && *ep.Conditions.Ready == ready, nil
	})
	if err != nil {
		t.Fatalf("endpoint %s of %s/%s with ready=%t: %v (last seen: %s)", addr, ns, svc, ready, err, seen)
	}
	return ep, ports
}

// TestEndpointSliceFromReadyPod checks the harness's central promise: a Pod
// made "ready" by CreateReadyPod becomes a ready endpoint in an
// EndpointSlice written by the real controller, with its node and zone, and
// SetPodReady(false) turns it not-ready.
func TestEndpointSliceFromReadyPod(t *testing.T) {
	c := cluster.Shared(t)
	ctx := t.Context()
	ns := c.Namespace(t)
	client := c.Client()

	node := "node-" + ns
	if _, err := c.CreateNode(ctx, node, "zone-a", "192.0.2.10"); err != nil {
		t.Fatal(err)
	}
	createWebService(ctx, t, client, ns)
	if _, err := c.CreateReadyPod(ctx, ns, "web-0", node, "10.244.1.5", map[string]string{"app": "web"}, webPorts); err != nil {
		t.Fatal(err)
	}

	ep, ports := waitEndpoint(ctx, t, client, ns, "web", "10.244.1.5", true)
	if ep.NodeName == nil || *ep.NodeName != node {
		t.Errorf("endpoint nodeName = %v, want %s", ep.NodeName, node)
	}
	if ep.Zone == nil || *ep.Zone != "zone-a" {
		t.Errorf("endpoint zone = %v, want zone-a", ep.Zone)
	}
	if ep.TargetRef == nil || ep.TargetRef.Kind != "Pod" || ep.TargetRef.Name != "web-0" {
		t.Errorf("endpoint targetRef = %+v, want Pod web-0", ep.TargetRef)
	}
	if len(ports) != 1 || ports[0].Port == nil || *ports[0].Port != 8080 {
		t.Errorf("slice ports = %+v, want the named port resolved to 8080", ports)
	}

	if err := c.SetPodReady(ctx, ns, "web-0", false); err != nil {
		t.Fatal(err)
	}
	waitEndpoint(ctx, t, client, ns, "web", "10.244.1.5", false)
}

// TestAPIServerRestart stops and restarts only kube-apiserver: clients fail
// while it is down, then work again on the same URL; what was stored before
// survives (etcd kept running), and the controller manager reconnects and
// keeps writing EndpointSlices. The API server binds a non-default address.
func TestAPIServerRestart(t *testing.T) {
	c := cluster.New(t, cluster.Options{BindAddress: "127.0.0.2"})
	if want := "https://127.0.0.2:" + strconv.Itoa(c.Port()); c.URL != want {
		t.Fatalf("URL = %s, want %s", c.URL, want)
	}
	ctx := t.Context()
	client := c.Client()
	const ns = "restart"
	if err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateNode(ctx, "node-1", "zone-a", "192.0.2.11"); err != nil {
		t.Fatal(err)
	}
	createWebService(ctx, t, client, ns)

	begin := time.Now()
	if err := c.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver stopped in %s", time.Since(begin).Round(time.Millisecond))
	short, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err := client.CoreV1().Namespaces().Get(short, ns, metav1.GetOptions{})
	cancel()
	if err == nil {
		t.Fatal("get namespace with kube-apiserver stopped: no error")
	}

	begin = time.Now()
	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver ready again in %s", time.Since(begin).Round(time.Millisecond))
	if _, err := client.CoreV1().Services(ns).Get(ctx, "web", metav1.GetOptions{}); err != nil {
		t.Fatalf("service created before the restart: %v", err)
	}
	if _, err := c.CreateReadyPod(ctx, ns, "web-0", "node-1", "10.244.2.7", map[string]string{"app": "web"}, webPorts); err != nil {
		t.Fatal(err)
	}
	waitEndpoint(ctx, t, client, ns, "web", "10.244.2.7", true)

	if err := c.StartAPIServer(ctx); err == nil {
		t.Error("StartAPIServer while running: no error")
	}
}

// TestWriteKubeconfig checks a kubeconfig for another host name of the API
// server works (the serving certificate covers it) and one for a host the
// certificate does not cover is refused.
func TestWriteKubeconfig(t *testing.T) {
	c := cluster.Shared(t)
	dir := t.TempDir()
	port := strconv.Itoa(c.Port())

	good := filepath.Join(dir, "good")
	if err := c.WriteKubeconfig(good, "https://localhost:"+port); err != nil {
		t.Fatal(err)
	}
	if _, err := listNamespaces(t, good); err != nil {
		t.Fatalf("kubeconfig for localhost: %v", err)
	}
	// c.Kubeconfig is written the same way, for c.URL.
	if _, err := listNamespaces(t, c.Kubeconfig); err != nil {
		t.Fatalf("c.Kubeconfig: %v", err)
	}

	bad := filepath.Join(dir, "bad")
	if err := c.WriteKubeconfig(bad, "https://127.0.0.2:"+port); err != nil {
		t.Fatal(err)
	}
	if _, err := listNamespaces(t, bad); err == nil {
		t.Fatal("kubeconfig for 127.0.0.2, which the certificate does not cover: no error")
	}
}

func listNamespaces(t *testing.T, kubeconfig string) (*corev1.NamespaceList, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.Timeout = 10 * time.Second
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return client.CoreV1().Namespaces().List(t.Context(), metav1.ListOptions{})
}

// TestHelperEdges: CreateNamespace is idempotent and leaves the default
// ServiceAccount; CreateNode refuses a bad address before creating
// anything; WaitFor gives up with ErrWaitTimeout.
func TestHelperEdges(t *testing.T) {
	c := cluster.Shared(t)
	ctx := t.Context()
	ns := c.Namespace(t)
	if err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client().CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("default service account: %v", err)
	}
	_, err := c.CreateNode(ctx, "node-"+ns, "zone-b", "not-an-ip")
	if err == nil {
		t.Fatal("CreateNode with a bad IP: no error")
	}
	if _, err := c.Client().CoreV1().Nodes().Get(ctx, "node-"+ns, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("node with a bad IP was created (get: %v)", err)
	}
	if err := cluster.WaitFor(ctx, 200*time.Millisecond, func(context.Context) (bool, error) { return false, nil }); !errors.Is(err, cluster.ErrWaitTimeout) {
		t.Fatalf("WaitFor on a never-true condition = %v, want ErrWaitTimeout", err)
	}
}
