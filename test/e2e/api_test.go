package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/test/agenttest"
	"github.com/edgeproxy/edgeproxy/test/cluster"
)

// Pods created by the tests, behind the real EndpointSlice controller: the
// plan must follow creates, readiness flips and deletes, over several ports
// and protocols with named target ports.
func TestPlanFollowsServicesAndPods(t *testing.T) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	client := c.Client()
	node(t, c, "follow-a", "zone-a", "192.0.2.11")
	node(t, c, "follow-b", "zone-b", "192.0.2.12")
	a := planAgent(t, c, "follow-a", "")

	ports := []corev1.ContainerPort{
		{Name: "web", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
		{Name: "dns", ContainerPort: 5353, Protocol: corev1.ProtocolUDP},
		{Name: "dns-tcp", ContainerPort: 5353, Protocol: corev1.ProtocolTCP},
	}
	create(t, client, service(ns, "web", "10.96.1.10", []corev1.ServicePort{
		tcp("http", 80, intstr.FromString("web")),
		udp("dns", 53, intstr.FromString("dns")),
		tcp("dns-tcp", 53, intstr.FromString("dns-tcp")),
	}))
	pod(t, c, ns, "web-1", "follow-a", "10.244.1.1", "web", ports...)
	pod(t, c, ns, "web-2", "follow-b", "10.244.2.1", "web", ports...)

	a.WaitPlanLines(converge, []string{
		fmt.Sprintf("TCP  10.96.1.10:80 ClusterIP %s/web:http -> 10.244.1.1:8080 w=1, 10.244.2.1:8080 w=1", ns),
		fmt.Sprintf("UDP  10.96.1.10:53 ClusterIP %s/web:dns -> 10.244.1.1:5353 w=1, 10.244.2.1:5353 w=1", ns),
		fmt.Sprintf("TCP  10.96.1.10:53 ClusterIP %s/web:dns-tcp -> 10.244.1.1:5353 w=1, 10.244.2.1:5353 w=1", ns),
	})

	// Readiness flip: the not-ready pod leaves the plan, and comes back.
	if err := c.SetPodReady(ctxFor(t), ns, "web-2", false); err != nil {
		t.Fatal(err)
	}
	a.WaitPlanLines(converge, []string{
		fmt.Sprintf("TCP  10.96.1.10:80 ClusterIP %s/web:http -> 10.244.1.1:8080 w=1", ns),
	})
	if err := c.SetPodReady(ctxFor(t), ns, "web-2", true); err != nil {
		t.Fatal(err)
	}
	a.WaitPlanLines(converge, []string{
		fmt.Sprintf("TCP  10.96.1.10:80 ClusterIP %s/web:http -> 10.244.1.1:8080 w=1, 10.244.2.1:8080 w=1", ns),
	})

	// A service that gets its first endpoint, then loses its last one.
	create(t, client, service(ns, "lonely", "10.96.1.11", []corev1.ServicePort{tcp("", 80, intstr.FromInt32(9000))}))
	a.WaitPlanLines(converge, []string{fmt.Sprintf("TCP  10.96.1.11:80 ClusterIP %s/lonely -> (none)", ns)})
	pod(t, c, ns, "lonely-1", "follow-b", "10.244.2.9", "lonely")
	a.WaitPlanLines(converge, []string{fmt.Sprintf("TCP  10.96.1.11:80 ClusterIP %s/lonely -> 10.244.2.9:9000 w=1", ns)})
	if err := client.CoreV1().Pods(ns).Delete(ctxFor(t), "lonely-1", metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}); err != nil {
		t.Fatal(err)
	}
	a.WaitPlanLines(converge, []string{fmt.Sprintf("TCP  10.96.1.11:80 ClusterIP %s/lonely -> (none)", ns)})

	// Updating a service's port moves its frontend; deleting it removes it.
	s, err := client.CoreV1().Services(ns).Get(ctxFor(t), "lonely", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Spec.Ports[0].Port = 81
	if _, err := client.CoreV1().Services(ns).Update(ctxFor(t), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	a.WaitPlanLines(converge, []string{fmt.Sprintf("TCP  10.96.1.11:81 ClusterIP %s/lonely -> (none)", ns)}, "10.96.1.11:80 ")
	if err := client.CoreV1().Services(ns).Delete(ctxFor(t), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	a.WaitPlanLines(converge, nil, ns+"/web:")

	// The change counters saw the changes; syncs were recorded.
	if v, err := a.Metric("kubeproxy_sync_proxy_rules_service_changes_total"); err != nil || v < 3 {
		t.Errorf("service changes counter = %v (%v), want >= 3", v, err)
	}
	if v, err := a.Metric("kubeproxy_sync_proxy_rules_duration_seconds_count"); err != nil || v < 1 {
		t.Errorf("sync duration count = %v (%v), want >= 1", v, err)
	}
}

// Traffic policies and topology with nodes in two zones; terminating
// fallback and endpoints spread over several slices, from slices written
// directly.
func TestPlanPoliciesTopologyTerminating(t *testing.T) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	client := c.Client()
	node(t, c, "topo-a1", "zone-a", "192.0.2.21")
	node(t, c, "topo-b1", "zone-b", "192.0.2.22")
	a := planAgent(t, c, "topo-a1", "")

	local := corev1.ServiceInternalTrafficPolicyLocal
	create(t, client, service(ns, "itp", "10.96.2.10", []corev1.ServicePort{tcp("", 80, intstr.FromInt32(8080))},
		func(s *corev1.Service) { s.Spec.InternalTrafficPolicy = &local }))
	create(t, client, service(ns, "etp", "10.96.2.11", []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: 30111, Protocol: corev1.ProtocolTCP}},
		func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}))
	create(t, client, service(ns, "zonal", "10.96.2.12", []corev1.ServicePort{tcp("", 80, intstr.FromInt32(8080))},
		func(s *corev1.Service) {
			s.Spec.TrafficDistribution = ptr(corev1.ServiceTrafficDistributionPreferSameZone)
		}))
	for _, app := range []string{"itp", "etp", "zonal"} {
		pod(t, c, ns, app+"-a", "topo-a1", "10.244.3."+map[string]string{"itp": "1", "etp": "2", "zonal": "3"}[app], app)
		pod(t, c, ns, app+"-b", "topo-b1", "10.244.4."+map[string]string{"itp": "1", "etp": "2", "zonal": "3"}[app], app)
	}
	p := a.WaitPlanLines(converge, []string{
		// internalTrafficPolicy Local: only this node's endpoint.
		fmt.Sprintf("TCP  10.96.2.10:80 ClusterIP %s/itp -> 10.244.3.1:8080 w=1", ns),
		// externalTrafficPolicy Local: cluster traffic to all, NodePort local
		// only, except from pods and the node (short-circuit to all).
		fmt.Sprintf("TCP  10.96.2.11:80 ClusterIP %s/etp -> 10.244.3.2:8080 w=1, 10.244.4.2:8080 w=1", ns),
		fmt.Sprintf("TCP  *:30111 NodePort %s/etp local -> 10.244.3.2:8080 w=1 | short-circuit -> 10.244.3.2:8080 w=1, 10.244.4.2:8080 w=1", ns),
		// PreferSameZone: the controller's zone hints keep zone-a traffic in zone-a.
		fmt.Sprintf("TCP  10.96.2.12:80 ClusterIP %s/zonal -> 10.244.3.3:8080 w=1", ns),
	})
	if ex := p.Explain[model.ServicePortName{Namespace: ns, Name: "zonal"}]; len(ex) != 1 || ex[0].Topology != "PreferSameZone" {
		t.Errorf("explain of zonal: %+v, want topology PreferSameZone", ex)
	}

	// Terminating fallback, over two slices written directly.
	create(t, client, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "drain"},
		Spec:       corev1.ServiceSpec{ClusterIP: "10.96.2.13", Ports: []corev1.ServicePort{tcp("http", 80, intstr.FromInt32(8080))}},
	})
	ports := []discoveryv1.EndpointPort{epPort("http", 8080)}
	s1 := slice(ns, "drain-1", "drain", ports,
		endpoint("10.244.5.1", "topo-a1", false, true, true),  // terminating, still serving
		endpoint("10.244.5.2", "topo-b1", false, false, true)) // terminating, not serving
	if _, err := client.DiscoveryV1().EndpointSlices(ns).Create(ctxFor(t), s1, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a.WaitPlanLines(converge, []string{fmt.Sprintf("TCP  10.96.2.13:80 ClusterIP %s/drain:http -> 10.244.5.1:8080 w=1", ns)})
	s2 := slice(ns, "drain-2", "drain", ports, endpoint("10.244.5.3", "topo-b1", true, true, false))
	if _, err := client.DiscoveryV1().EndpointSlices(ns).Create(ctxFor(t), s2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A ready endpoint in the second slice: the terminating one is dropped.
	a.WaitPlanLines(converge, []string{fmt.Sprintf("TCP  10.96.2.13:80 ClusterIP %s/drain:http -> 10.244.5.3:8080 w=1", ns)})
	s3 := slice(ns, "drain-3", "drain", ports, endpoint("10.244.5.4", "topo-a1", true, true, false))
	if _, err := client.DiscoveryV1().EndpointSlices(ns).Create(ctxFor(t), s3, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a.WaitPlanLines(converge, []string{fmt.Sprintf("TCP  10.96.2.13:80 ClusterIP %s/drain:http -> 10.244.5.3:8080 w=1, 10.244.5.4:8080 w=1", ns)})
}

// Services meant for another proxy, headless and ExternalName Services
// produce nothing; a Service labelled with our own proxy name (proxyName
// set) does, and with the default (no proxyName) it does not, as with
// kube-proxy. The
// headless and other-proxy Services and the headless slices are selected
// out by the API server, as kube-proxy's are: they never reach the agent
// (only the ExternalName Service, which kube-proxy's selectors let
// through too, is received and skipped). A Service relabelled between no
// proxy name, ours and another proxy's follows each step.
func TestPlanIgnoresServicesNotForUs(t *testing.T) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	client := c.Client()
	node(t, c, "ignore-a", "zone-a", "192.0.2.31")
	a := planAgent(t, c, "ignore-a", "proxyName: edgeproxy\n")
	unnamed := planAgent(t, c, "ignore-a", "")
	labelled := func(v string) svcOpt {
		return func(s *corev1.Service) {
			s.Labels = map[string]string{"service.kubernetes.io/service-proxy-name": v}
		}
	}
	p80 := []corev1.ServicePort{tcp("", 80, intstr.FromInt32(80))}
	create(t, client, service(ns, "other-proxy", "10.96.3.10", p80, labelled("cilium")))
	create(t, client, service(ns, "ours", "10.96.3.11", p80, labelled("edgeproxy")))
	create(t, client, service(ns, "headless", "None", p80))
	create(t, client, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "external"},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.invalid"},
	})
	pod(t, c, ns, "headless-1", "ignore-a", "10.244.6.1", "headless")
	// The headless Service's slice exists before the last Service and
	// the last slice change are written: once the agent has those, it
	// has been sent everything before them on both watches.
	a.Eventually(converge, "the headless slice", func() error {
		l, err := client.DiscoveryV1().EndpointSlices(ns).List(ctxFor(t), metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=headless"})
		if err != nil {
			return err
		}
		for _, s := range l.Items {
			if _, ok := s.Labels[corev1.IsHeadlessService]; ok && len(s.Endpoints) > 0 {
				return nil
			}
		}
		return fmt.Errorf("no headless slice with an endpoint yet: %d slices", len(l.Items))
	})
	create(t, client, service(ns, "plain", "10.96.3.12", p80))
	pod(t, c, ns, "plain-1", "ignore-a", "10.244.6.2", "plain")
	a.WaitPlanLines(converge, []string{
		fmt.Sprintf("TCP  10.96.3.11:80 ClusterIP %s/ours -> (none)", ns),
		fmt.Sprintf("TCP  10.96.3.12:80 ClusterIP %s/plain -> 10.244.6.2:80 w=1", ns),
	})
	unnamed.WaitPlanLines(converge, []string{fmt.Sprintf("TCP  10.96.3.12:80 ClusterIP %s/plain -> 10.244.6.2:80 w=1", ns)})
	for ag, skipped := range map[*agenttest.Agent][]string{
		a:       {"other-proxy", "headless", "external"},
		unnamed: {"other-proxy", "ours", "headless", "external"},
	} {
		p, err := ag.Plan()
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range skipped {
			if strings.Contains(p.Text, ns+"/"+name) {
				t.Errorf("service %s is in the plan:\n%s", name, p.Text)
			}
		}
	}
	for kind, want := range map[string]float64{"Service": 1, "EndpointSlice": 0} {
		got, err := a.Metric(fmt.Sprintf(`edgeproxy_source_objects_skipped_total{kind=%q,reason="ignored"}`, kind))
		if err != nil {
			t.Fatal(err)
		}
		if max(got, 0) != want {
			t.Errorf("%s objects received and ignored: %g, want %g (only the ExternalName Service crosses the selectors)", kind, got, want)
		}
	}

	relabel := func(label string, port int32) {
		t.Helper()
		s, err := client.CoreV1().Services(ns).Get(ctxFor(t), "plain", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Labels = nil
		if label != "" {
			s.Labels = map[string]string{"service.kubernetes.io/service-proxy-name": label}
		}
		s.Spec.Ports[0].Port = port
		if _, err := client.CoreV1().Services(ns).Update(ctxFor(t), s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Unlabelled → ours: it leaves one watch and enters the other.
	relabel("edgeproxy", 81)
	a.WaitPlanLines(converge, []string{fmt.Sprintf("TCP  10.96.3.12:81 ClusterIP %s/plain -> 10.244.6.2:80 w=1", ns)}, "10.96.3.12:80 ")
	// Ours → another proxy's: gone.
	relabel("cilium", 82)
	a.WaitPlanLines(converge, nil, ns+"/plain")
	// Another proxy's → unlabelled: back.
	relabel("", 83)
	a.WaitPlanLines(converge, []string{fmt.Sprintf("TCP  10.96.3.12:83 ClusterIP %s/plain -> 10.244.6.2:80 w=1", ns)})
	// Unlabelled → ours → unlabelled again, the last port wins.
	relabel("edgeproxy", 84)
	relabel("", 85)
	a.WaitPlanLines(converge, []string{fmt.Sprintf("TCP  10.96.3.12:85 ClusterIP %s/plain -> 10.244.6.2:80 w=1", ns)}, "10.96.3.12:84 ")
}

// Objects the proxy cannot use are skipped, logged once and counted, and
// the rest keeps working.
func TestPlanSkipsBadObjects(t *testing.T) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	client := c.Client()
	node(t, c, "bad-a", "zone-a", "192.0.2.41")
	a := planAgent(t, c, "bad-a", "")
	create(t, client, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "good"},
		Spec:       corev1.ServiceSpec{ClusterIP: "10.96.4.10", Ports: []corev1.ServicePort{tcp("http", 80, intstr.FromInt32(8080))}},
	})
	ready := endpoint("10.244.7.1", "bad-a", true, true, false)
	fqdn := slice(ns, "fqdn", "good", []discoveryv1.EndpointPort{epPort("http", 8080)},
		discoveryv1.Endpoint{Addresses: []string{"pod.example.invalid"}})
	fqdn.AddressType = discoveryv1.AddressTypeFQDN
	noLabel := slice(ns, "nolabel", "", []discoveryv1.EndpointPort{epPort("http", 8080)}, ready)
	noNumber := slice(ns, "nonumber", "good", []discoveryv1.EndpointPort{
		{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP)}, // no port number
		epPort("other", 9090),
	}, ready)
	goodSlice := slice(ns, "good-1", "good", []discoveryv1.EndpointPort{epPort("http", 8080)}, endpoint("10.244.7.2", "bad-a", true, true, false))
	for _, s := range []*discoveryv1.EndpointSlice{fqdn, noLabel, noNumber, goodSlice} {
		if _, err := client.DiscoveryV1().EndpointSlices(ns).Create(ctxFor(t), s, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create slice %s: %v", s.Name, err)
		}
	}
	a.WaitPlanLines(converge, []string{fmt.Sprintf("TCP  10.96.4.10:80 ClusterIP %s/good:http -> 10.244.7.2:8080 w=1", ns)})
	a.Eventually(converge, "skip counters", func() error {
		whole, err := a.Metric(`edgeproxy_source_objects_skipped_total{kind="EndpointSlice",reason="bad"}`)
		if err != nil {
			return err
		}
		part, err := a.Metric(`edgeproxy_source_objects_skipped_total{kind="EndpointSlice-part",reason="bad"}`)
		if err != nil {
			return err
		}
		if whole < 2 || part < 1 {
			return fmt.Errorf("skipped whole=%v part=%v, want >= 2 and >= 1", whole, part)
		}
		return nil
	})
	// An update that keeps the same problem is counted but not logged again.
	s, err := client.DiscoveryV1().EndpointSlices(ns).Get(ctxFor(t), "fqdn", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Labels["touched"] = "yes"
	if _, err := client.DiscoveryV1().EndpointSlices(ns).Update(ctxFor(t), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	a.Eventually(converge, "second count", func() error {
		v, err := a.Metric(`edgeproxy_source_objects_skipped_total{kind="EndpointSlice",reason="bad"}`)
		if err != nil || v < 3 {
			return fmt.Errorf("skipped = %v (%v), want >= 3", v, err)
		}
		return nil
	})
	for _, name := range []string{ns + "/fqdn", ns + "/nolabel", ns + "/nonumber"} {
		if n := strings.Count(a.Log(), "object="+name+" "); n != 1 {
			t.Errorf("%s logged %d times, want once:\n%s", name, n, a.Log())
		}
	}
}

// The API server goes away and comes back: the agent keeps its last plan,
// stays healthy (its rules are still right), and converges afterwards
// without a restart of its own.
func TestPlanSurvivesAPIServerRestart(t *testing.T) {
	c := cluster.New(t, cluster.Options{})
	ctx := ctxFor(t)
	if err := c.CreateNamespace(ctx, "restart"); err != nil {
		t.Fatal(err)
	}
	node(t, c, "restart-a", "zone-a", "192.0.2.51")
	a := planAgent(t, c, "restart-a", "sync: {minPeriod: 100ms, period: 2s, healthTimeout: 5s}")
	client := c.Client()
	create(t, client, service("restart", "before", "10.96.5.10", []corev1.ServicePort{tcp("", 80, intstr.FromInt32(80))}))
	want := []string{"TCP  10.96.5.10:80 ClusterIP restart/before -> (none)"}
	a.WaitPlanLines(converge, want)

	if err := c.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	// Longer than the health timeout and several periodic resyncs.
	deadline := time.Now().Add(8 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
		code, h, err := a.Health()
		if err != nil || code != 200 || !h.Healthy {
			t.Fatalf("/healthz while the API server is down: %d %+v %v", code, h, err)
		}
		a.WaitPlanLines(time.Second, want)
	}
	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	create(t, client, service("restart", "after", "10.96.5.11", []corev1.ServicePort{tcp("", 80, intstr.FromInt32(80))}))
	a.WaitPlanLines(2*converge, append(want, "TCP  10.96.5.11:80 ClusterIP restart/after -> (none)"))
	if a.Exited() {
		t.Fatal("agent exited")
	}
}
