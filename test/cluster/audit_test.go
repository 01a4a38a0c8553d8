package cluster_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/edgeproxy/edgeproxy/test/cluster"
)

// The audit log tells a client's full reads (a LIST) from a watch that
// starts from a resourceVersion, by user agent, and records no writes.
func TestAuditEvents(t *testing.T) {
	c := cluster.New(t, cluster.Options{Audit: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rc := c.RESTConfig()
	rc.UserAgent = "audit-test"
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	since := time.Now().Add(-time.Second) // the log's timestamps are in microseconds
	ns := c.Namespace(t)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "written"}}
	if _, err := client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	l, err := client.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := client.CoreV1().Services(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: l.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	var reads map[string]int
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		evs, err := c.AuditEvents("audit-test", since)
		if err != nil {
			t.Fatal(err)
		}
		reads = map[string]int{}
		for _, e := range evs {
			if e.Resource() == "services" && e.Read() != "" {
				reads[e.Read()]++
				if e.Read() == "watch" && !strings.Contains(e.RequestURI, "resourceVersion="+l.ResourceVersion) {
					t.Errorf("watch %s: not from resourceVersion %s", e.RequestURI, l.ResourceVersion)
				}
			}
			if e.Verb == "create" || e.Verb == "update" {
				t.Errorf("a write was recorded: %s %s", e.Verb, e.RequestURI)
			}
		}
		if reads["list"] == 1 && reads["watch"] == 1 {
			break
		}
	}
	w.Stop()
	if reads["list"] != 1 || reads["watch"] != 1 || reads["watch-list"] != 0 {
		t.Fatalf("reads %v, want one list and one watch", reads)
	}
}
