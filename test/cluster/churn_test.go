package cluster_test

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/edgeproxy/edgeproxy/test/cluster"
)

// A watch from a resourceVersion the watch caches still hold resumes:
// Gone says no after the churn changed each resource since the
// watermark. (Its yes needs 75 s of history: TestAPIOutageBeyondWatchCache
// in test/netns/e2e.) Delete removes the churn's objects.
func TestChurnNotGoneWithinTheCache(t *testing.T) {
	c := cluster.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := c.Namespace(t)
	rv, err := c.Watermark(ctx)
	if err != nil {
		t.Fatal(err)
	}
	churn, err := c.NewChurn(ctx, ns, ns+"-churn")
	if err != nil {
		t.Fatal(err)
	}
	if err := churn.Change(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if gone, err := c.Gone(ctx, rv); err != nil || gone {
		t.Fatalf("Gone(%s) = %v, %v; want a watch that resumes", rv, gone, err)
	}
	node, err := c.Client().CoreV1().Nodes().Get(ctx, ns+"-churn", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v := node.Annotations["edgeproxy.test/churn"]; v == "" {
		t.Errorf("the churn node's annotations: %v, want the churn's", node.Annotations)
	}
	if err := churn.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client().CoreV1().Nodes().Get(ctx, ns+"-churn", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the churn node after Delete: %v, want not found", err)
	}
}
