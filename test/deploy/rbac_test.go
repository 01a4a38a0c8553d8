// Package deploy holds the tests of deploy/'s files that need a real
// kube-apiserver (test/cluster): they live in the test module, with the
// harness.
package deploy_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/test/cluster"
)

// TestRBACOnAPIServer applies deploy/rbac.yaml to a real kube-apiserver (RBAC
// authorizer) and acts as a node's identity, user edgeproxy:node:edge-1 in
// group edgeproxy:nodes, through impersonation: everything the agent needs is
// allowed, everything else is forbidden.
func TestRBACOnAPIServer(t *testing.T) {
	if _, err := cluster.BinDir(); err != nil {
		gate.Skip(t, err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stop cluster: %v", err)
		}
	})
	admin := c.Client()

	role, binding := readRBAC(t, "../../deploy/rbac.yaml")
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateNode(ctx, "edge-1", "z1", "192.0.2.10"); err != nil {
		t.Fatal(err)
	}

	as := func(user string, groups ...string) kubernetes.Interface {
		cfg := c.RESTConfig()
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return cs
	}
	node := as("edgeproxy:node:edge-1", "edgeproxy:nodes")

	// The authorizer learns of new RBAC objects through its own informers:
	// wait (bounded) until the first grant is visible.
	if err := cluster.WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		_, err := node.CoreV1().Services("").List(ctx, metav1.ListOptions{})
		if apierrors.IsForbidden(err) {
			return false, nil
		}
		return err == nil, err
	}); err != nil {
		t.Fatalf("the node identity never got to list services: %v", err)
	}

	watch := func(w interface{ Stop() }, err error) error {
		if err == nil {
			w.Stop()
		}
		return err
	}
	allowed := map[string]func() error{
		"list services": func() error {
			_, err := node.CoreV1().Services("").List(ctx, metav1.ListOptions{})
			return err
		},
		"watch services": func() error {
			return watch(node.CoreV1().Services("").Watch(ctx, metav1.ListOptions{}))
		},
		"list endpointslices": func() error {
			_, err := node.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
			return err
		},
		"watch endpointslices": func() error {
			return watch(node.DiscoveryV1().EndpointSlices("").Watch(ctx, metav1.ListOptions{}))
		},
		"get own node": func() error {
			_, err := node.CoreV1().Nodes().Get(ctx, "edge-1", metav1.GetOptions{})
			return err
		},
		"list nodes": func() error {
			_, err := node.CoreV1().Nodes().List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=edge-1"})
			return err
		},
		"watch nodes": func() error {
			return watch(node.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=edge-1"}))
		},
	}
	for what, do := range allowed {
		if err := do(); err != nil {
			t.Errorf("%s: %v, want allowed", what, err)
		}
	}

	forbidden := map[string]func() error{
		"list secrets": func() error {
			_, err := node.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
			return err
		},
		"list endpoints": func() error {
			_, err := node.CoreV1().Endpoints("").List(ctx, metav1.ListOptions{})
			return err
		},
		"list pods": func() error {
			_, err := node.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
			return err
		},
		"list configmaps": func() error {
			_, err := node.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{})
			return err
		},
		"create service": func() error {
			_, err := node.CoreV1().Services("default").Create(ctx, &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: "x"},
				Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
			}, metav1.CreateOptions{})
			return err
		},
		"delete service": func() error {
			return node.CoreV1().Services("default").Delete(ctx, "kubernetes", metav1.DeleteOptions{})
		},
		"create endpointslice": func() error {
			_, err := node.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Name: "x"},
				AddressType: discoveryv1.AddressTypeIPv4,
			}, metav1.CreateOptions{})
			return err
		},
		"patch node": func() error {
			_, err := node.CoreV1().Nodes().Patch(ctx, "edge-1", types.MergePatchType,
				[]byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
			return err
		},
		"create event": func() error {
			_, err := node.CoreV1().Events("default").Create(ctx, &corev1.Event{
				ObjectMeta:     metav1.ObjectMeta{Name: "x"},
				InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: "edge-1"},
			}, metav1.CreateOptions{})
			return err
		},
	}
	for what, do := range forbidden {
		if err := do(); !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v, want Forbidden", what, err)
		}
	}

	// The grant is to the group: the same user outside it gets nothing.
	stranger := as("edgeproxy:node:edge-1")
	_, err = stranger.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("list services without the group: %v, want Forbidden", err)
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("test ran out of time")
	}
}

// readRBAC decodes the ClusterRole and ClusterRoleBinding of a manifest
// strictly (unknown fields fail); deploy's own tests check the rest of it.
func readRBAC(t *testing.T, path string) (*rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var role *rbacv1.ClusterRole
	var binding *rbacv1.ClusterRoleBinding
	for doc := range strings.SplitSeq(string(b), "\n---\n") {
		var obj any
		switch {
		case strings.Contains("\n"+doc, "\nkind: ClusterRole\n"):
			role = &rbacv1.ClusterRole{}
			obj = role
		case strings.Contains("\n"+doc, "\nkind: ClusterRoleBinding\n"):
			binding = &rbacv1.ClusterRoleBinding{}
			obj = binding
		default:
			continue
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	if role == nil || binding == nil {
		t.Fatalf("%s: no ClusterRole or no ClusterRoleBinding", path)
	}
	return role, binding
}
