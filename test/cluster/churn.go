package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
)

// Churn is one object of each resource a proxy reads that no proxy is
// sent: a headless Service, its EndpointSlice (labelled headless, as the
// EndpointSlice controller labels them) and a Node of its own; kube-proxy's
// selectors and a proxy's node name leave them out. Changing them fills the
// API server's watch caches of services, endpointslices and nodes until
// older resourceVersions are gone from them (410 Gone), as in a busy
// cluster. A watch cache keeps at least 75 s of events and evicts only when
// full, so events younger than that are never gone.
type Churn struct {
	c    *Cluster
	ns   string
	name string
	mu   sync.Mutex
	n    int
}

// NewChurn creates the churn's objects, named name, in namespace ns.
func (c *Cluster) NewChurn(ctx context.Context, ns, name string) (*Churn, error) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Port: 80}}}}
	if _, err := c.client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("cluster: churn service: %w", err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{
			discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "edgeproxy-test-churn", corev1.IsHeadlessService: ""}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	if _, err := c.client.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("cluster: churn endpointslice: %w", err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := c.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("cluster: churn node: %w", err)
	}
	return &Churn{c: c, ns: ns, name: name}, nil
}

// Change changes each of the churn's objects n times (an annotation),
// with a few requests at a time.
func (ch *Churn) Change(ctx context.Context, n int) error {
	const workers = 8
	client := ch.c.client
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				ch.mu.Lock()
				ch.n++
				k := ch.n
				ch.mu.Unlock()
				patch := []byte(fmt.Sprintf(`{"metadata":{"annotations":{"edgeproxy.test/churn":"%d"}}}`, k))
				var err error
				if _, err = client.CoreV1().Services(ch.ns).Patch(ctx, ch.name, types.MergePatchType, patch, metav1.PatchOptions{}); err == nil {
					if _, err = client.DiscoveryV1().EndpointSlices(ch.ns).Patch(ctx, ch.name, types.MergePatchType, patch, metav1.PatchOptions{}); err == nil {
						_, err = client.CoreV1().Nodes().Patch(ctx, ch.name, types.MergePatchType, patch, metav1.PatchOptions{})
					}
				}
				if err != nil {
					errs <- fmt.Errorf("cluster: churn: %w", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// UntilGone changes the churn's objects round times each, then again, until
// a watch of each resource from rv is answered 410 Gone (Gone), at most
// maxRounds rounds. It returns how many times each object was changed.
// rv must be older than the churn's first change.
func (ch *Churn) UntilGone(ctx context.Context, rv string, round, maxRounds int) (int, error) {
	for i := 1; i <= maxRounds; i++ {
		if err := ch.Change(ctx, round); err != nil {
			return i * round, err
		}
		gone, err := ch.c.Gone(ctx, rv)
		if err != nil || gone {
			return i * round, err
		}
	}
	return maxRounds * round, fmt.Errorf("cluster: after %d changes of each resource a watch from %s still resumes", maxRounds*round, rv)
}

// Gone says whether a watch of Services, EndpointSlices and Nodes from
// rv is answered 410 Gone for all three: the API server no longer has the
// events since rv. Each resource must have changed since rv (Churn), so
// that a watch the API server can still serve starts with an event at once.
func (c *Cluster) Gone(ctx context.Context, rv string) (bool, error) {
	opts := metav1.ListOptions{ResourceVersion: rv}
	watches := []struct {
		resource string
		start    func(context.Context) (watch.Interface, error)
	}{
		{"services", func(ctx context.Context) (watch.Interface, error) {
			return c.client.CoreV1().Services("").Watch(ctx, opts)
		}},
		{"endpointslices", func(ctx context.Context) (watch.Interface, error) {
			return c.client.DiscoveryV1().EndpointSlices("").Watch(ctx, opts)
		}},
		{"nodes", func(ctx context.Context) (watch.Interface, error) { return c.client.CoreV1().Nodes().Watch(ctx, opts) }},
	}
	all := true
	for _, w := range watches {
		gone, err := func() (bool, error) {
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			wi, err := w.start(ctx)
			if err != nil {
				return apierrors.IsResourceExpired(err) || apierrors.IsGone(err), ignoreGone(err)
			}
			defer wi.Stop()
			select {
			case ev, ok := <-wi.ResultChan():
				switch {
				case !ok:
					return false, fmt.Errorf("ended without an event")
				case ev.Type != watch.Error:
					return false, nil
				}
				err := apierrors.FromObject(ev.Object)
				return apierrors.IsResourceExpired(err) || apierrors.IsGone(err), ignoreGone(err)
			case <-ctx.Done():
				return false, fmt.Errorf("no event in 30 s, though the resource changed since")
			}
		}()
		if err != nil {
			return false, fmt.Errorf("cluster: watch %s from %s: %w", w.resource, rv, err)
		}
		all = all && gone
	}
	return all, nil
}

func ignoreGone(err error) error {
	if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		return nil
	}
	return err
}

// Delete deletes the churn's objects.
func (ch *Churn) Delete(ctx context.Context) error {
	client := ch.c.client
	return errors.Join(
		ignoreNotFound(client.CoreV1().Services(ch.ns).Delete(ctx, ch.name, metav1.DeleteOptions{})),
		ignoreNotFound(client.DiscoveryV1().EndpointSlices(ch.ns).Delete(ctx, ch.name, metav1.DeleteOptions{})),
		ignoreNotFound(client.CoreV1().Nodes().Delete(ctx, ch.name, metav1.DeleteOptions{})))
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// Watermark returns the resourceVersion now and then writes another
// resource (a ConfigMap in default), so that every event of a Service,
// EndpointSlice or Node after it is at least two versions beyond it: the
// API server still resumes a watch from rv while the oldest event it keeps
// is rv+1, so without the gap a watch from rv could never be Gone.
func (c *Cluster) Watermark(ctx context.Context) (string, error) {
	list, err := c.client.CoreV1().Services("").List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return "", fmt.Errorf("cluster: watermark: %w", err)
	}
	cms := c.client.CoreV1().ConfigMaps(metav1.NamespaceDefault)
	patch := []byte(fmt.Sprintf(`{"data":{"resourceVersion":%q}}`, list.ResourceVersion))
	_, err = cms.Patch(ctx, "edgeproxy-test-watermark", types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "edgeproxy-test-watermark"}, Data: map[string]string{"resourceVersion": list.ResourceVersion}}
		_, err = cms.Create(ctx, cm, metav1.CreateOptions{})
	}
	if err != nil {
		return "", fmt.Errorf("cluster: watermark: %w", err)
	}
	return list.ResourceVersion, nil
}
