package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// Labels CreateNode sets.
const (
	ZoneLabel   = "topology.kubernetes.io/zone"
	RegionLabel = "topology.kubernetes.io/region"
	// Region is the region of every node CreateNode makes.
	Region = "edge-region"
)

// CreateNamespace creates namespace ns (if missing) and its default
// ServiceAccount, which Pods need before they can be created.
func (c *Cluster) CreateNamespace(ctx context.Context, ns string) error {
	_, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("cluster: create namespace %s: %w", ns, err)
	}
	return c.EnsureDefaultServiceAccount(ctx, ns)
}

// EnsureDefaultServiceAccount creates the "default" ServiceAccount of ns if
// it is missing. No controller does it here (only the EndpointSlice
// controllers run), and the ServiceAccount admission plugin rejects Pods
// without it.
func (c *Cluster) EnsureDefaultServiceAccount(ctx context.Context, ns string) error {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns}}
	_, err := c.client.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("cluster: create default service account in %s: %w", ns, err)
	}
	return nil
}

// CreateNode creates a Ready Node labelled with zone (and Region) whose
// status carries internalIP (and more, for a dual-stack node) as its
// InternalIP addresses. Create a Pod's Node before the Pod: the
// EndpointSlice controller skips Pods whose Node it cannot find.
func (c *Cluster) CreateNode(ctx context.Context, name, zone, internalIP string, more ...string) (*corev1.Node, error) {
	var addrs []corev1.NodeAddress
	for _, ip := range append([]string{internalIP}, more...) {
		if _, err := netip.ParseAddr(ip); err != nil {
			return nil, fmt.Errorf("cluster: node %s: internal IP: %w", name, err)
		}
		addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: name,
		Labels: map[string]string{
			"kubernetes.io/hostname": name,
			ZoneLabel:                zone,
			RegionLabel:              Region,
		},
	}}
	created, err := c.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("cluster: create node %s: %w", name, err)
	}
	// Status is ignored on create; it has its own subresource.
	created.Status.Addresses = append(addrs, corev1.NodeAddress{Type: corev1.NodeHostName, Address: name})
	created.Status.Conditions = []corev1.NodeCondition{{
		Type:               corev1.NodeReady,
		Status:             corev1.ConditionTrue,
		Reason:             "EdgeproxyTest",
		LastHeartbeatTime:  metav1.Now(),
		LastTransitionTime: metav1.Now(),
	}}
	updated, err := c.client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("cluster: node %s: update status: %w", name, err)
	}
	return updated, nil
}

// CreateReadyPod creates Pod ns/name bound to nodeName, with one container
// exposing ports, then writes its status as a kubelet would: Running, with
// podIP, and Ready. The EndpointSlice controller then lists it as a ready
// endpoint of every Service whose selector matches labels.
func (c *Cluster) CreateReadyPod(ctx context.Context, ns, name, nodeName, podIP string, labels map[string]string, ports []corev1.ContainerPort) (*corev1.Pod, error) {
	return c.CreateReadyPodIPs(ctx, ns, name, nodeName, []string{podIP}, labels, ports)
}

// CreateReadyPodIPs is CreateReadyPod for a pod with several addresses (a
// dual-stack pod: one per family, the first is status.podIP).
func (c *Cluster) CreateReadyPodIPs(ctx context.Context, ns, name, nodeName string, podIPs []string, labels map[string]string, ports []corev1.ContainerPort) (*corev1.Pod, error) {
	if len(podIPs) == 0 {
		return nil, fmt.Errorf("cluster: pod %s/%s: no pod IP", ns, name)
	}
	var ips []corev1.PodIP
	for _, ip := range podIPs {
		if _, err := netip.ParseAddr(ip); err != nil {
			return nil, fmt.Errorf("cluster: pod %s/%s: pod IP: %w", ns, name, err)
		}
		ips = append(ips, corev1.PodIP{IP: ip})
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName: nodeName,
			Containers: []corev1.Container{{
				Name:  "app",
				Image: "registry.k8s.io/pause:3.10", // never pulled: there is no kubelet
				Ports: ports,
			}},
		},
	}
	created, err := c.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("cluster: create pod %s/%s: %w", ns, name, err)
	}
	now := metav1.Now()
	created.Status = corev1.PodStatus{
		Phase:     corev1.PodRunning,
		PodIP:     podIPs[0],
		PodIPs:    ips,
		StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
	}
	updated, err := c.client.CoreV1().Pods(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("cluster: pod %s/%s: update status: %w", ns, name, err)
	}
	return updated, nil
}

// SetPodReady sets the Ready and ContainersReady conditions of Pod ns/name.
func (c *Cluster) SetPodReady(ctx context.Context, ns, name string, ready bool) error {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pod, err := c.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, typ := range []corev1.PodConditionType{corev1.ContainersReady, corev1.PodReady} {
			setPodCondition(&pod.Status, typ, status)
		}
		_, err = c.client.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("cluster: pod %s/%s: set ready=%t: %w", ns, name, ready, err)
	}
	return nil
}

// WaitSliceReady waits until the EndpointSlices of Service ns/service say
// of address ip what ready says: listed and ready, or not listed as ready.
// It is for tests that change a pod and then check a proxy: it bounds the
// controller manager's part apart from the proxy's. Errors from the API
// server are ridden out until timeout.
func (c *Cluster) WaitSliceReady(ctx context.Context, ns, service, ip string, ready bool, timeout time.Duration) error {
	sel := metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + service}
	err := WaitFor(ctx, timeout, func(ctx context.Context) (bool, error) {
		list, err := c.client.DiscoveryV1().EndpointSlices(ns).List(ctx, sel)
		if err != nil {
			return false, nil
		}
		return sliceSaysReady(list.Items, ip) == ready, nil
	})
	if err != nil {
		return fmt.Errorf("cluster: slices of %s/%s: %s ready=%t: %w", ns, service, ip, ready, err)
	}
	return nil
}

// sliceSaysReady reports whether any of slices lists ip as ready (a nil
// Ready counts as ready, as the API documents).
func sliceSaysReady(slices []discoveryv1.EndpointSlice, ip string) bool {
	for _, s := range slices {
		for _, e := range s.Endpoints {
			for _, a := range e.Addresses {
				if a == ip && (e.Conditions.Ready == nil || *e.Conditions.Ready) {
					return true
				}
			}
		}
	}
	return false
}

func setPodCondition(s *corev1.PodStatus, typ corev1.PodConditionType, status corev1.ConditionStatus) {
	for i := range s.Conditions {
		if s.Conditions[i].Type == typ {
			if s.Conditions[i].Status != status {
				s.Conditions[i].Status = status
				s.Conditions[i].LastTransitionTime = metav1.Now()
			}
			return
		}
	}
	s.Conditions = append(s.Conditions, corev1.PodCondition{Type: typ, Status: status, LastTransitionTime: metav1.Now()})
}

// ErrWaitTimeout is wrapped by WaitFor's error when the condition never held.
var ErrWaitTimeout = errors.New("condition not met in time")

// WaitFor calls cond every 50ms until it returns true, returns an error,
// ctx ends or timeout passes; the error on timeout wraps ErrWaitTimeout. An
// error from cond ends the wait: to ride out transient errors (say during
// an API server restart) return (false, nil) instead. Use it for
// "eventually" checks against the cluster; it is a bound, never an
// assertion about speed.
func WaitFor(ctx context.Context, timeout time.Duration, cond func(ctx context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := cond(ctx)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: wait %s: %w: %w", timeout, ErrWaitTimeout, ctx.Err())
		case <-tick.C:
		}
	}
}
