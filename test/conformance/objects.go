package conformance

// The world's Kubernetes objects: the Nodes, Pods and Services the matrix
// judges, how each shape's Service is written and changed, and the waits
// for the controllers that follow them.

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/edgeproxy/edgeproxy/test/cluster"
)

// populate creates the Nodes, Pods and Services and waits for the
// EndpointSlice controller to have written every Service's slices.
func (w *World) populate(ctx context.Context) error {
	c := w.Cluster
	addrs := podAddrs()
	if err := c.CreateNamespace(ctx, namespace); err != nil {
		return err
	}
	nodes := []struct {
		name string
		ips  []netip.Addr
	}{
		{NodeName, []netip.Addr{nodeIP4, nodeIP6}},
		{"node-b", []netip.Addr{remoteNode4, remoteNode6}},
		{"node-c", []netip.Addr{nodeC4, nodeC6}},
		{"node-d", []netip.Addr{nodeD4, nodeD6}},
	}
	for _, n := range nodes {
		node, err := c.CreateNode(ctx, n.name, nodeZones[n.name], n.ips[0].String(), n.ips[1].String())
		if err != nil {
			return err
		}
		if nodeZones[n.name] == "" {
			// No zone at all, not an empty one.
			delete(node.Labels, cluster.ZoneLabel)
			if _, err := w.Client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("node %s without a zone: %w", n.name, err)
			}
		}
	}
	for name, ip := range addrs {
		if name == "outpod" {
			continue
		}
		node := NodeName
		if r, ok := remotePods[name]; ok {
			node = r
		}
		labels := map[string]string{}
		for _, s := range Shapes {
			if slices.Contains(s.Pods, name) {
				labels["s-"+s.Name] = "y"
			}
		}
		if _, err := c.CreateReadyPodIPs(ctx, namespace, name, node, []string{ip[0].String(), ip[1].String()}, labels, podPorts[name]); err != nil {
			return err
		}
		if notReady[name] {
			if err := c.SetPodReady(ctx, namespace, name, false); err != nil {
				return err
			}
		}
		if terminal[name] {
			// No kubelet: the Pod stays terminating, not ready, and serving
			// as long as its Ready condition is true (not tn).
			grace := int64(3600)
			if err := w.Client.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
				return fmt.Errorf("terminate pod %s: %w", name, err)
			}
		}
	}
	if err := w.otherNamespaces(ctx); err != nil {
		return err
	}
	for i := range Shapes {
		s := &Shapes[i]
		svc, err := w.createService(ctx, s, nil)
		if err != nil {
			return err
		}
		w.setService(s.Name, svc)
	}
	w.nameServices()
	return w.waitSlices(ctx)
}

// otherNamespaces creates the namespaces of shapes that name one, each
// with Pod objects for the pods its shapes select: the same pods (name,
// node, addresses) as in namespace, since a Service selects Pods of its
// own namespace only.
func (w *World) otherNamespaces(ctx context.Context) error {
	addrs := podAddrs()
	pods := map[string]map[string]map[string]string{} // namespace → pod → labels
	for _, s := range Shapes {
		if s.ns() == namespace {
			continue
		}
		if pods[s.ns()] == nil {
			pods[s.ns()] = map[string]map[string]string{}
		}
		for _, p := range s.Pods {
			if terminal[p] || notReady[p] {
				return fmt.Errorf("shape %s: pod %s: only ready pods are made in another namespace", s.Name, p)
			}
			if pods[s.ns()][p] == nil {
				pods[s.ns()][p] = map[string]string{}
			}
			pods[s.ns()][p]["s-"+s.Name] = "y"
		}
	}
	for _, ns := range slices.Sorted(maps.Keys(pods)) {
		if err := w.Cluster.CreateNamespace(ctx, ns); err != nil {
			return err
		}
		for _, name := range slices.Sorted(maps.Keys(pods[ns])) {
			node := NodeName
			if r, ok := remotePods[name]; ok {
				node = r
			}
			ip := addrs[name]
			if _, err := w.Cluster.CreateReadyPodIPs(ctx, ns, name, node, []string{ip[0].String(), ip[1].String()}, pods[ns][name], podPorts[name]); err != nil {
				return err
			}
		}
	}
	return nil
}

// createService creates the shape's Service; with prev (the one a change
// cell deleted), at prev's addresses and NodePorts.
func (w *World) createService(ctx context.Context, s *Shape, prev *corev1.Service) (*corev1.Service, error) {
	client := w.Client.CoreV1().Services(s.ns())
	policy := map[string]corev1.IPFamilyPolicy{"dual": corev1.IPFamilyPolicyPreferDualStack, "v4": corev1.IPFamilyPolicySingleStack, "v6": corev1.IPFamilyPolicySingleStack}[s.Families]
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.ns(), Name: s.svcName()},
		Spec: corev1.ServiceSpec{
			Type:           s.Type,
			Selector:       map[string]string{"s-" + s.Name: "y"},
			IPFamilyPolicy: &policy,
		},
	}
	for _, p := range s.ports() {
		target := intstr.FromInt32(targetPort)
		if p.Target != "" {
			target = intstr.FromString(p.Target)
		}
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: p.Name, Port: p.Port, TargetPort: target, Protocol: p.Proto})
	}
	switch s.Families {
	case "v4":
		svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol}
	case "v6":
		svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
	}
	if s.ETP == "Local" && s.Type != cip {
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	if s.ETP == "Local" && s.Type == cip && s.ExternalIPs {
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	if s.ITP == "Local" {
		local := corev1.ServiceInternalTrafficPolicyLocal
		svc.Spec.InternalTrafficPolicy = &local
	}
	if s.Affinity {
		svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	}
	if s.AffinityTimeout > 0 {
		timeout := s.AffinityTimeout
		svc.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout}}
	}
	if s.Traffic != "" {
		svc.Spec.TrafficDistribution = &s.Traffic
	}
	if s.ExternalIPs {
		for _, a := range s.externalIPs() {
			svc.Spec.ExternalIPs = append(svc.Spec.ExternalIPs, a.String())
		}
	}
	switch s.SourceRange {
	case SourceClient:
		svc.Spec.LoadBalancerSourceRanges = []string{netip.PrefixFrom(client4, 32).String(), netip.PrefixFrom(client6, 128).String()}
	case SourceNode:
		svc.Spec.LoadBalancerSourceRanges = []string{netip.PrefixFrom(nodeIP4, 32).String(), netip.PrefixFrom(nodeIP6, 128).String()}
	}
	if prev != nil {
		svc.Spec.ClusterIP, svc.Spec.ClusterIPs, svc.Spec.IPFamilies = prev.Spec.ClusterIP, prev.Spec.ClusterIPs, prev.Spec.IPFamilies
		for i := range svc.Spec.Ports {
			svc.Spec.Ports[i].NodePort = prev.Spec.Ports[i].NodePort
		}
	}
	created, err := client.Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create service %s: %w", s.Name, err)
	}
	if s.Type != lb {
		return created, nil
	}
	mode := corev1.LoadBalancerIPModeVIP
	if s.IPModeProxy {
		mode = corev1.LoadBalancerIPModeProxy
	}
	for _, a := range s.lbIPs() {
		created.Status.LoadBalancer.Ingress = append(created.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: a.String(), IPMode: &mode})
	}
	updated, err := client.UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("service %s: load balancer status: %w", s.Name, err)
	}
	return updated, nil
}

// waitSlices waits until every Service's slices list exactly its pods,
// and those of a Service with a trafficDistribution carry the zone hints
// the controller writes for it.
func (w *World) waitSlices(ctx context.Context) error {
	for _, s := range Shapes {
		if err := w.waitEndpoints(ctx, s.Name, s.Pods); err != nil {
			return err
		}
		if s.Traffic != "" {
			if err := w.waitHints(ctx, s.Name, s.Traffic == string(corev1.ServiceTrafficDistributionPreferSameNode)); err != nil {
				return err
			}
		}
	}
	return nil
}

// nodeZones are the zones of the world's Nodes (populate).
var nodeZones = map[string]string{NodeName: "zone-a", "node-b": "zone-b", "node-c": "zone-a", "node-d": ""}

// waitHints waits (bounded) until every endpoint of the Service of shape
// name carries the hint the EndpointSlice controller writes for
// trafficDistribution: for its own zone, the zone of its pod's Node, and
// with forNodes (PreferSameNode) for that Node too. Without them both
// proxies would send to every endpoint, and the zone cells would match for
// nothing; this is the world's half of their anchor.
func (w *World) waitHints(ctx context.Context, name string, forNodes bool) error {
	var last string
	s := shape(name)
	err := cluster.WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		list, err := w.Client.DiscoveryV1().EndpointSlices(s.ns()).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + s.svcName()})
		if err != nil || len(list.Items) == 0 {
			last = fmt.Sprintf("no slices (%v)", err)
			return false, nil
		}
		for _, sl := range list.Items {
			for _, e := range sl.Endpoints {
				node := ""
				if e.NodeName != nil {
					node = *e.NodeName
				}
				zone := nodeZones[node]
				if zone == "" {
					// The controller hints no endpoint whose Node has no zone.
					if e.Hints != nil {
						last = fmt.Sprintf("endpoint %v on %q (no zone): hints %+v, want none", e.Addresses, node, e.Hints)
						return false, nil
					}
					continue
				}
				if e.Hints == nil || len(e.Hints.ForZones) != 1 || e.Hints.ForZones[0].Name != zone {
					last = fmt.Sprintf("endpoint %v on %q: hints %+v, want for zone %q", e.Addresses, node, e.Hints, zone)
					return false, nil
				}
				if forNodes && (len(e.Hints.ForNodes) != 1 || e.Hints.ForNodes[0].Name != node) {
					last = fmt.Sprintf("endpoint %v on %q: hints %+v, want for node %q", e.Addresses, node, e.Hints, node)
					return false, nil
				}
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("zone hints of %s (%s): %w", name, last, err)
	}
	return nil
}

// waitEndpoints waits until the slices of the Service of shape name hold
// exactly the addresses of pods (both families).
func (w *World) waitEndpoints(ctx context.Context, name string, pods []string) error {
	want := map[string]bool{}
	svc := w.service(name)
	s := shape(name)
	addrs := podAddrs()
	for _, p := range pods {
		for _, f := range svc.Spec.IPFamilies {
			if f == corev1.IPv4Protocol {
				want[addrs[p][0].String()] = true
			} else {
				want[addrs[p][1].String()] = true
			}
		}
	}
	err := cluster.WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		list, err := w.Client.DiscoveryV1().EndpointSlices(s.ns()).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + s.svcName()})
		if err != nil {
			return false, nil
		}
		got := map[string]bool{}
		for _, sl := range list.Items {
			for _, e := range sl.Endpoints {
				for _, a := range e.Addresses {
					got[a] = true
				}
			}
		}
		if len(got) != len(want) {
			return false, nil
		}
		for a := range want {
			if !got[a] {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("endpoints of %s: want %v: %w", name, pods, err)
	}
	return nil
}

// service is the Service of shape name.
func (w *World) service(name string) *corev1.Service {
	w.svcMu.RLock()
	defer w.svcMu.RUnlock()
	return w.Services[name]
}

func (w *World) setService(name string, svc *corev1.Service) {
	w.svcMu.Lock()
	defer w.svcMu.Unlock()
	w.Services[name] = svc
}

// applyChange makes a change shape's change (forward) or puts it back,
// and waits until the Service's slices show it. A deleted Service comes
// back at its addresses and NodePorts; until then the cells send to them.
func (w *World) applyChange(ctx context.Context, s *Shape, forward bool) error {
	switch s.Change {
	case ChangeReplace:
		from, to := "sa", "sb"
		if !forward {
			from, to = to, from
		}
		// The old endpoint leaves before the new one joins: the Service
		// passes through no endpoints, never through both, so a new flow
		// that reaches the new one shows a proxy that no longer has the
		// old one (with both, kube-proxy IPVS's rr sent every other new
		// flow to sb while its next sync, slow in the VM, had yet to
		// remove sa: the old flow was judged before that).
		if err := w.setLabel(ctx, s.Name, from, false); err != nil {
			return err
		}
		if err := w.setLabel(ctx, s.Name, to, true); err != nil {
			return err
		}
		return w.waitEndpoints(ctx, s.Name, []string{to})
	case ChangeAdd, ChangeRemove:
		on := forward == (s.Change == ChangeAdd)
		if err := w.setLabel(ctx, s.Name, "sa", on); err != nil {
			return err
		}
		if on {
			return w.waitEndpoints(ctx, s.Name, []string{"sa"})
		}
		return w.waitEndpoints(ctx, s.Name, nil)
	case ChangeDelete:
		if forward {
			if err := w.Client.CoreV1().Services(s.ns()).Delete(ctx, s.svcName(), metav1.DeleteOptions{}); err != nil {
				return fmt.Errorf("delete service %s: %w", s.Name, err)
			}
			return nil
		}
		// The addresses and NodePorts are free again once the delete is
		// done; a create that comes first is retried (bounded).
		var last error
		err := cluster.WaitFor(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
			svc, err := w.createService(ctx, s, w.service(s.Name))
			if err != nil {
				last = err
				return false, nil
			}
			w.setService(s.Name, svc)
			return true, nil
		})
		if err != nil {
			return fmt.Errorf("recreate service %s: %v: %w", s.Name, last, err)
		}
		return w.waitEndpoints(ctx, s.Name, s.Pods)
	case ChangePort:
		port := int32(changedPort)
		if !forward {
			port = servicePort
		}
		svc := w.service(s.Name).DeepCopy()
		svc.Spec.Ports[0].Port = port
		updated, err := w.Client.CoreV1().Services(s.ns()).Update(ctx, svc, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("service %s: port %d: %w", s.Name, port, err)
		}
		w.setService(s.Name, updated)
		return nil
	}
	return fmt.Errorf("shape %s: unknown change %q", s.Name, s.Change)
}

// setLabel puts pod in (on) or out of the selector of the Service of
// shape.
func (w *World) setLabel(ctx context.Context, shape, pod string, on bool) error {
	value := `"y"`
	if !on {
		value = "null"
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, "s-"+shape, value)
	if _, err := w.Client.CoreV1().Pods(namespace).Patch(ctx, pod, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("label pod %s for %s: %w", pod, shape, err)
	}
	return nil
}
