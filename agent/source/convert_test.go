package source

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

func ptr[T any](v T) *T { return &v }

func TestServiceConversion(t *testing.T) {
	conv := &Converter{ProxyName: "edgeproxy", KeepPrefix: "edgeproxy.io/"}
	base := func() *v1.Service {
		return &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", Annotations: map[string]string{
				"edgeproxy.io/weights": "a=1", "kubectl.kubernetes.io/last-applied-configuration": "{...}",
			}},
			Spec: v1.ServiceSpec{ClusterIP: "10.96.0.1", ClusterIPs: []string{"10.96.0.1", "fd00::1"}, Ports: []v1.ServicePort{{Port: 80}}},
		}
	}
	tests := []struct {
		name    string
		mod     func(*v1.Service)
		skip    bool   // ErrSkip expected
		wantErr string // substring of a bad-object error
		check   func(*testing.T, *v1.Service)
	}{
		{name: "headless", mod: func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"} }, skip: true},
		{name: "external name", mod: func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeExternalName }, skip: true},
		{name: "other proxy", mod: func(s *v1.Service) {
			s.Labels = map[string]string{LabelServiceProxyName: "cilium"}
		}, skip: true},
		{name: "our proxy name", mod: func(s *v1.Service) {
			s.Labels = map[string]string{LabelServiceProxyName: "edgeproxy"}
		}},
		{name: "bad cluster IP", mod: func(s *v1.Service) { s.Spec.ClusterIPs = []string{"10.96.0.300"} }, wantErr: `spec.clusterIPs[0]: "10.96.0.300" is not an IP address`},
		{name: "no cluster IP", mod: func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil }, wantErr: "no address allocated"},
		{name: "bad source range", mod: func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/33"} }, wantErr: "loadBalancerSourceRanges[0]"},
		{name: "bad protocol", mod: func(s *v1.Service) { s.Spec.Ports[0].Protocol = "ICMP" }, wantErr: "spec.ports[0].protocol"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := base()
			tt.mod(s)
			m, _, err := conv.Service(s)
			switch {
			case tt.skip:
				if !errors.Is(err, ErrSkip) {
					t.Fatalf("err = %v, want ErrSkip", err)
				}
			case tt.wantErr != "":
				if err == nil || errors.Is(err, ErrSkip) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
			default:
				if err != nil || m == nil {
					t.Fatalf("err = %v", err)
				}
			}
		})
	}

	s := base()
	s.Spec.Type = v1.ServiceTypeLoadBalancer
	s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	s.Spec.HealthCheckNodePort = 32000
	s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	s.Spec.Ports[0].NodePort = 30080
	s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{
		{IP: "192.0.2.1"}, {IP: "192.0.2.2", IPMode: ptr(v1.LoadBalancerIPModeProxy)}, {Hostname: "lb.example"},
	}
	m, _, err := conv.Service(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.ClusterIPs) != 2 || !m.ExternalLocal || m.HealthCheckNodePort != 32000 || m.Affinity != 3*time.Hour {
		t.Errorf("converted: %+v", m)
	}
	if len(m.LoadBalancerIPs) != 1 || m.LoadBalancerIPs[0] != netip.MustParseAddr("192.0.2.1") {
		t.Errorf("LB IPs = %v, want only 192.0.2.1 (ipMode Proxy and hostnames skipped)", m.LoadBalancerIPs)
	}
	if m.Ports[0].Protocol != "TCP" || m.Ports[0].NodePort != 30080 {
		t.Errorf("port = %+v", m.Ports[0])
	}
	if _, ok := m.Annotations["edgeproxy.io/weights"]; !ok || len(m.Annotations) != 1 {
		t.Errorf("annotations kept = %v, want only the policy one", m.Annotations)
	}
}

func TestEndpointSliceConversion(t *testing.T) {
	conv := &Converter{}
	s := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "s-1", Labels: map[string]string{LabelServiceName: "s"}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080))}, {Name: ptr("all")}},
		Endpoints: []discovery.Endpoint{
			{Addresses: []string{"10.0.0.1"}}, // nil conditions: ready
			{Addresses: []string{"10.0.0.2"}, Conditions: discovery.EndpointConditions{Ready: ptr(false)}}, // serving follows ready
			{Addresses: []string{"10.0.0.3"}, Conditions: discovery.EndpointConditions{Ready: ptr(false), Serving: ptr(true), Terminating: ptr(true)}},
			{Addresses: []string{"bogus"}},
			{Addresses: []string{"fd00::1"}},
		},
	}
	m, warnings, err := conv.EndpointSlice(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Ports) != 1 || m.Ports[0].Protocol != "TCP" || m.Ports[0].Port != 8080 {
		t.Errorf("ports = %+v, want only http/TCP/8080", m.Ports)
	}
	if len(m.Endpoints) != 3 {
		t.Fatalf("endpoints = %+v, want 3", m.Endpoints)
	}
	if e := m.Endpoints[0]; !e.Ready || !e.Serving || e.Terminating {
		t.Errorf("nil conditions read as %+v, want ready and serving", e)
	}
	if e := m.Endpoints[1]; e.Ready || e.Serving {
		t.Errorf("ready=false read as %+v, want not serving either", e)
	}
	if e := m.Endpoints[2]; e.Ready || !e.Serving || !e.Terminating {
		t.Errorf("terminating read as %+v", e)
	}
	want := []string{"ports[1]: no port number", `endpoints[3].addresses[0]: "bogus" is not an IP address`, "endpoints[4].addresses[0]: fd00::1 is not of addressType IPv4"}
	if strings.Join(warnings, "|") != strings.Join(want, "|") {
		t.Errorf("warnings = %q, want %q", warnings, want)
	}

	// A slice labelled headless (any value) is not proxied, as kube-proxy's
	// informer selects !service.kubernetes.io/headless: upstream's e2e
	// "should implement service.kubernetes.io/headless" labels a working
	// Service's slice and expects the Service to stop answering.
	s.Labels[LabelHeadless] = ""
	if m, _, err := conv.EndpointSlice(s); !errors.Is(err, ErrSkip) || m != nil {
		t.Errorf("slice labelled %s: (%v, %v), want ErrSkip", LabelHeadless, m, err)
	}
	delete(s.Labels, LabelHeadless)

	s.AddressType = discovery.AddressTypeFQDN
	if _, _, err := conv.EndpointSlice(s); err == nil || !strings.Contains(err.Error(), "FQDN") {
		t.Errorf("FQDN slice: err = %v", err)
	}
	s.AddressType = discovery.AddressTypeIPv4
	delete(s.Labels, LabelServiceName)
	if _, _, err := conv.EndpointSlice(s); err == nil || !strings.Contains(err.Error(), "kubernetes.io/service-name") {
		t.Errorf("slice without label: err = %v", err)
	}
}

func TestTransformStripsNodes(t *testing.T) {
	conv := &Converter{KeepPrefix: "edgeproxy.io/"}
	n := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}},
			Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0", "edgeproxy.io/x": "y"}},
		Status: v1.NodeStatus{Images: []v1.ContainerImage{{Names: []string{"big"}}}, Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.0.2.1"}}},
	}
	out, err := conv.Transform(n)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*v1.Node)
	if got.ManagedFields != nil || got.Status.Images != nil || len(got.Annotations) != 1 || len(got.Status.Addresses) != 1 {
		t.Errorf("stripped node: %+v", got)
	}
}

// richObjects are a Service, an EndpointSlice and a Node with every field
// the converter reads set, and much it does not, as an API server lists
// them.
func richObjects() (*v1.Service, *discovery.EndpointSlice, *v1.Node) {
	meta := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Namespace: "ns", Name: name, UID: "u-1", ResourceVersion: "42", GenerateName: name + "-",
			CreationTimestamp: metav1.NewTime(time.Unix(1700000000, 0)),
			Labels:            map[string]string{"app": "web", LabelServiceName: "web", LabelZone: "z1", LabelRegion: "r1"},
			Annotations: map[string]string{"edgeproxy.io/weights": "a=1", AnnotationTopologyMode: "Auto",
				AnnotationTriggerTime: "2026-11-24T10:00:00Z", "kubectl.kubernetes.io/last-applied-configuration": "{...}"},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
			OwnerReferences: []metav1.OwnerReference{{Kind: "Service", Name: "web"}}, Finalizers: []string{"f"}}
	}
	local, proxyMode := v1.ServiceInternalTrafficPolicyLocal, v1.LoadBalancerIPModeProxy
	svc := &v1.Service{ObjectMeta: meta("web"), Spec: v1.ServiceSpec{
		Type: v1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.1", ClusterIPs: []string{"10.96.0.1", "fd00::1"},
		Selector: map[string]string{"app": "web"}, ExternalIPs: []string{"192.0.2.7"}, LoadBalancerIP: "192.0.2.8",
		LoadBalancerSourceRanges: []string{"198.51.100.0/24"}, ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyLocal,
		InternalTrafficPolicy: &local, HealthCheckNodePort: 32000, TrafficDistribution: ptr("PreferClose"),
		SessionAffinity: v1.ServiceAffinityClientIP, SessionAffinityConfig: &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr(int32(60))}},
		IPFamilies: []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}, AllocateLoadBalancerNodePorts: ptr(true),
		Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, NodePort: 30080, AppProtocol: ptr("http")},
			{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53}},
	}, Status: v1.ServiceStatus{LoadBalancer: v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{
		{IP: "192.0.2.100", Hostname: "lb.example"}, {IP: "192.0.2.101", IPMode: &proxyMode}}},
		Conditions: []metav1.Condition{{Type: "Ready"}}}}
	sl := &discovery.EndpointSlice{ObjectMeta: meta("web-abc"), AddressType: discovery.AddressTypeIPv4,
		Ports: []discovery.EndpointPort{{Name: ptr("http"), Protocol: ptr(v1.ProtocolTCP), Port: ptr(int32(8080)), AppProtocol: ptr("http")}}}
	for i, ready := range []bool{true, false} {
		sl.Endpoints = append(sl.Endpoints, discovery.Endpoint{
			Addresses:  []string{"10.0.0." + string(rune('1'+i)), "10.0.1.1"},
			Conditions: discovery.EndpointConditions{Ready: ptr(ready), Serving: ptr(true), Terminating: ptr(!ready)},
			Hostname:   ptr("h"), NodeName: ptr("n1"), Zone: ptr("z1"),
			Hints:              &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: "z1"}}, ForNodes: []discovery.ForNode{{Name: "n1"}}},
			TargetRef:          &v1.ObjectReference{Kind: "Pod", Name: "web-1"},
			DeprecatedTopology: map[string]string{"k": "v"},
		})
	}
	node := &v1.Node{ObjectMeta: meta("n1"),
		Spec: v1.NodeSpec{PodCIDR: "10.244.0.0/24", PodCIDRs: []string{"10.244.0.0/24", "fd00:244::/64"}, ProviderID: "kind://n1", Taints: []v1.Taint{{Key: TaintToBeDeleted, Effect: v1.TaintEffectNoSchedule}}},
		Status: v1.NodeStatus{Images: []v1.ContainerImage{{Names: []string{"big"}}}, Conditions: []v1.NodeCondition{{Type: v1.NodeReady}},
			Capacity:  v1.ResourceList{},
			Addresses: []v1.NodeAddress{{Type: v1.NodeExternalIP, Address: "192.0.2.1"}, {Type: v1.NodeInternalIP, Address: "10.0.0.9"}}}}
	return svc, sl, node
}

// Transform caches what the converter makes of a Service or an
// EndpointSlice (the same as converting the whole object), under the
// object's key, and a Node that converts as the whole one does; its output
// comes back unchanged, and a bad object is cached with its error.
func TestTransform(t *testing.T) {
	conv := &Converter{ProxyName: "", KeepPrefix: "edgeproxy.io/"}
	svc, sl, node := richObjects()
	transform := func(o any) any {
		t.Helper()
		out, err := conv.Transform(o)
		if err != nil {
			t.Fatal(err)
		}
		if again, err := conv.Transform(out); err != nil || again != out {
			t.Fatalf("Transform of its own output = %v, %v; want it unchanged", again, err)
		}
		return out
	}
	wantSvc, _, err := conv.Service(svc.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	c := transform(svc.DeepCopy()).(*Converted)
	if c.Err != nil || !reflect.DeepEqual(c.Service, wantSvc) || c.Slice != nil {
		t.Errorf("Service transforms to\n%+v, %v\nwant\n%+v", c.Service, c.Err, wantSvc)
	}
	if key, err := cache.MetaNamespaceKeyFunc(c); err != nil || key != "ns/web" || c.Meta.ResourceVersion != "42" || c.Meta.UID != "u-1" {
		t.Errorf("transformed Service: key %q, %v; meta %+v", key, err, c.Meta)
	}
	wantSl, wantWarn, err := conv.EndpointSlice(sl.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	c = transform(sl.DeepCopy()).(*Converted)
	if c.Err != nil || !reflect.DeepEqual(c.Slice, wantSl) || !reflect.DeepEqual(c.Warnings, wantWarn) {
		t.Errorf("EndpointSlice transforms to\n%+v %v, %v\nwant\n%+v %v", c.Slice, c.Warnings, c.Err, wantSl, wantWarn)
	}
	if got, want := conv.Node(transform(node.DeepCopy()).(*v1.Node)), conv.Node(node.DeepCopy()); !reflect.DeepEqual(got, want) {
		t.Errorf("stripped Node converts to\n%+v\nwant\n%+v", got, want)
	}
	n := transform(node).(*v1.Node)
	if n.Status.Images != nil || n.Status.Conditions != nil || n.Spec.ProviderID != "" || n.ManagedFields != nil {
		t.Errorf("stripped Node keeps what is not read: %+v", n)
	}
	if n.Name != "n1" || n.Namespace != "ns" || n.UID != "u-1" || n.ResourceVersion != "42" {
		t.Errorf("stripped Node lost what the informer needs: %+v", n.ObjectMeta)
	}
	if got := conv.Node(n).PodCIDRs; len(got) != 2 {
		t.Errorf("stripped Node's pod ranges: %v, want both of spec.podCIDRs", got)
	}

	bad := svc.DeepCopy()
	bad.Labels[LabelServiceProxyName] = "other"
	if c := transform(bad).(*Converted); !errors.Is(c.Err, ErrSkip) || c.Service != nil {
		t.Errorf("Service of another proxy transforms to %+v, %v; want ErrSkip", c.Service, c.Err)
	}
}

// TestConvertNodePodCIDRs: the Node's pod ranges (detectLocalMode
// NodeCIDR) come from spec.podCIDRs, or spec.podCIDR alone from an older
// writer; an unparsable one is left out.
func TestConvertNodePodCIDRs(t *testing.T) {
	conv := &Converter{}
	p := netip.MustParsePrefix
	for _, tc := range []struct {
		name string
		spec v1.NodeSpec
		want []netip.Prefix
	}{
		{"dual-stack", v1.NodeSpec{PodCIDR: "10.244.3.0/24", PodCIDRs: []string{"10.244.3.0/24", "fd00:244:3::/64"}}, []netip.Prefix{p("10.244.3.0/24"), p("fd00:244:3::/64")}},
		{"podCIDR alone", v1.NodeSpec{PodCIDR: "10.244.3.0/24"}, []netip.Prefix{p("10.244.3.0/24")}},
		{"none", v1.NodeSpec{}, nil},
		{"unparsable left out", v1.NodeSpec{PodCIDRs: []string{"10.244.3.0/33", "fd00:244:3::/64"}}, []netip.Prefix{p("fd00:244:3::/64")}},
		{"host bits cleared", v1.NodeSpec{PodCIDRs: []string{"10.244.3.7/24"}}, []netip.Prefix{p("10.244.3.0/24")}},
	} {
		got := conv.Node(&v1.Node{Spec: tc.spec}).PodCIDRs
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: PodCIDRs %v, want %v", tc.name, got, tc.want)
		}
	}
}
