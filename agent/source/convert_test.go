package source

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
			m, err := conv.Service(s)
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
	m, err := conv.Service(s)
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

func TestStripKeepsOnlyWhatIsRead(t *testing.T) {
	conv := &Converter{KeepPrefix: "edgeproxy.io/"}
	n := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}},
			Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0", "edgeproxy.io/x": "y"}},
		Status: v1.NodeStatus{Images: []v1.ContainerImage{{Names: []string{"big"}}}, Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.0.2.1"}}},
	}
	out, err := conv.Strip(n)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*v1.Node)
	if got.ManagedFields != nil || got.Status.Images != nil || len(got.Annotations) != 1 || len(got.Status.Addresses) != 1 {
		t.Errorf("stripped node: %+v", got)
	}
}
