package deploy_test

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/edgeproxy/edgeproxy/agent/config"
)

// decodeAll decodes every document of a manifest file strictly (unknown
// fields fail) into the API type its kind names.
func decodeAll(t *testing.T, path string) []any {
	t.Helper()
	var objs []any
	for i, doc := range strings.Split(string(read(t, path)), "\n---\n") {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("%s doc %d: %v", path, i, err)
		}
		var obj any
		switch tm.APIVersion + "/" + tm.Kind {
		case "rbac.authorization.k8s.io/v1/ClusterRole":
			obj = &rbacv1.ClusterRole{}
		case "rbac.authorization.k8s.io/v1/ClusterRoleBinding":
			obj = &rbacv1.ClusterRoleBinding{}
		case "v1/ServiceAccount":
			obj = &corev1.ServiceAccount{}
		case "v1/ConfigMap":
			obj = &corev1.ConfigMap{}
		case "apps/v1/DaemonSet":
			obj = &appsv1.DaemonSet{}
		default:
			t.Fatalf("%s doc %d: unexpected %s %s", path, i, tm.APIVersion, tm.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s doc %d (%s): %v", path, i, tm.Kind, err)
		}
		objs = append(objs, obj)
	}
	return objs
}

func only[T any](t *testing.T, objs []any) T {
	t.Helper()
	var found []T
	for _, o := range objs {
		if v, ok := o.(T); ok {
			found = append(found, v)
		}
	}
	if len(found) != 1 {
		t.Fatalf("found %d objects of type %T, want 1", len(found), found)
	}
	return found[0]
}

func TestRBACLeastPrivilege(t *testing.T) {
	objs := decodeAll(t, "rbac.yaml")
	if len(objs) != 2 {
		t.Fatalf("rbac.yaml has %d objects, want a ClusterRole and a ClusterRoleBinding", len(objs))
	}
	role := only[*rbacv1.ClusterRole](t, objs)
	if role.Name != "edgeproxy" {
		t.Errorf("ClusterRole is named %q", role.Name)
	}
	// group/resource → verbs, exactly.
	want := map[string][]string{
		"/services":                       {"list", "watch"},
		"discovery.k8s.io/endpointslices": {"list", "watch"},
		"/nodes":                          {"get", "list", "watch"},
	}
	got := map[string][]string{}
	for _, r := range role.Rules {
		if len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
			t.Errorf("unexpected rule %+v", r)
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				k := g + "/" + res
				got[k] = append(got[k], r.Verbs...)
			}
		}
	}
	for k := range got {
		slices.Sort(got[k])
		got[k] = slices.Compact(got[k])
	}
	if len(got) != len(want) {
		t.Errorf("the role grants %v, want exactly %v", got, want)
	}
	for k, verbs := range want {
		if !slices.Equal(got[k], verbs) {
			t.Errorf("%s: verbs %v, want %v", k, got[k], verbs)
		}
	}

	b := only[*rbacv1.ClusterRoleBinding](t, objs)
	if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != role.Name || b.RoleRef.APIGroup != rbacv1.GroupName {
		t.Errorf("binding refers to %+v", b.RoleRef)
	}
	if len(b.Subjects) != 1 || b.Subjects[0].Kind != rbacv1.GroupKind || b.Subjects[0].Name != "edgeproxy:nodes" {
		t.Errorf("binding subjects %+v, want the group edgeproxy:nodes", b.Subjects)
	}
}

func TestDaemonSet(t *testing.T) {
	objs := decodeAll(t, "daemonset.yaml")
	sa := only[*corev1.ServiceAccount](t, objs)
	b := only[*rbacv1.ClusterRoleBinding](t, objs)
	if b.RoleRef.Name != "edgeproxy" || len(b.Subjects) != 1 ||
		b.Subjects[0].Kind != rbacv1.ServiceAccountKind || b.Subjects[0].Name != sa.Name || b.Subjects[0].Namespace != sa.Namespace {
		t.Errorf("binding %+v does not bind the ClusterRole to ServiceAccount %s/%s", b, sa.Namespace, sa.Name)
	}
	ds := only[*appsv1.DaemonSet](t, objs)
	spec := ds.Spec.Template.Spec
	if spec.ServiceAccountName != sa.Name || !spec.HostNetwork {
		t.Errorf("pods run as %q with hostNetwork=%v", spec.ServiceAccountName, spec.HostNetwork)
	}
	if ds.Spec.Selector == nil || ds.Spec.Selector.MatchLabels["app.kubernetes.io/name"] != ds.Spec.Template.Labels["app.kubernetes.io/name"] {
		t.Error("selector does not match the pod template")
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers", len(spec.Containers))
	}
	c := spec.Containers[0]
	// The API server's own address: the in-cluster default, the kubernetes
	// Service's ClusterIP, has no proxy behind it on a node where
	// edgeproxy replaces kube-proxy, so the Pod would wait forever (seen on
	// a real node by test/upstream).
	set := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			set[e.Name] = e.Value
		}
	}
	for _, name := range []string{"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"} {
		if set[name] == "" {
			t.Errorf("the container does not set %s: the in-cluster config would dial the kubernetes Service, which nothing serves before edgeproxy runs", name)
		}
	}
	var env []string
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			env = append(env, e.Name+"=edge-1") // the downward API's spec.nodeName
			continue
		}
		env = append(env, e.Name+"="+e.Value)
	}

	// The ConfigMap's config and the container's environment load with the
	// agent's own loader.
	cm := only[*corev1.ConfigMap](t, objs)
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(cm.Data["config.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(config.LoadOptions{
		File: file, Env: env,
		Hostname: func() (string, error) { return "container-hostname", nil },
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatalf("DaemonSet config: %v", err)
	}
	if cfg.NodeName != "edge-1" {
		t.Errorf("nodeName %q, want the downward API's node name", cfg.NodeName)
	}
	mounts := map[string]bool{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = true
	}
	for _, p := range []string{"/etc/edgeproxy", cfg.StateDir, "/run/xtables.lock"} {
		if !mounts[p] {
			t.Errorf("nothing mounted at %s", p)
		}
	}
}

func TestKubeconfigTemplate(t *testing.T) {
	tmpl := string(read(t, "kubeconfig.template"))
	filled := strings.NewReplacer(
		"@SERVER@", "https://127.0.0.1:6443",
		"@CA_DATA@", "Q0EgY2VydA==",
		"@NODE@", "edge-1",
	).Replace(tmpl)
	if i := strings.Index(filled, "@"); i >= 0 {
		t.Fatalf("placeholder left after filling: %q", filled[i:min(len(filled), i+20)])
	}
	kc, err := clientcmd.Load([]byte(filled))
	if err != nil {
		t.Fatal(err)
	}
	ctx, ok := kc.Contexts[kc.CurrentContext]
	if !ok {
		t.Fatalf("current context %q does not exist", kc.CurrentContext)
	}
	cl, ok := kc.Clusters[ctx.Cluster]
	if !ok || cl.Server != "https://127.0.0.1:6443" || string(cl.CertificateAuthorityData) != "CA cert" {
		t.Errorf("cluster %q = %+v", ctx.Cluster, cl)
	}
	u, ok := kc.AuthInfos[ctx.AuthInfo]
	if !ok {
		t.Fatalf("user %q does not exist", ctx.AuthInfo)
	}
	if ctx.AuthInfo != "edgeproxy:node:edge-1" {
		t.Errorf("user is named %q, want the node's identity", ctx.AuthInfo)
	}
	if u.ClientCertificate != "/etc/edgeproxy/pki/node.crt" || u.ClientKey != "/etc/edgeproxy/pki/node.key" {
		t.Errorf("client credentials at %q and %q", u.ClientCertificate, u.ClientKey)
	}
}
