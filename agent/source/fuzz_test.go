package source

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// FuzzManifest: any bytes as a manifest file are split, decoded and
// converted without a panic; every object decoded is either converted or
// refused with an error.
func FuzzManifest(f *testing.F) {
	f.Add([]byte(svcYAML("t", "web", "10.96.0.1", 80)))
	f.Add([]byte(svcYAML("t", "a", "10.96.0.1", 80) + "---\nkind: [unclosed\n---\n" + svcYAML("t", "c", "fd00::1", 443)))
	f.Add([]byte(`{"apiVersion":"v1","kind":"Service","metadata":{"name":"j","namespace":"t"},"spec":{"clusterIP":"10.96.0.9","ports":[{"port":53,"protocol":"UDP","nodePort":30053}],"type":"NodePort"}}`))
	f.Add([]byte("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s-1, namespace: t, labels: {kubernetes.io/service-name: s}}\naddressType: IPv4\nports: [{port: 8080}]\nendpoints: [{addresses: [10.244.0.1], conditions: {ready: true}, hints: {forZones: [{name: a}]}}]\n"))
	f.Add([]byte("apiVersion: v1\nkind: Node\nmetadata: {name: n1}\nstatus: {addresses: [{type: InternalIP, address: 192.168.0.1}]}\n"))
	f.Add([]byte("a: &a [*a, *a, *a]\n"))
	conv := &Converter{ProxyName: "edgeproxy", KeepPrefix: "edgeproxy.io/"}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 1<<16 {
			return
		}
		objs, _ := decodeDocs("fuzz.yaml", b)
		for _, l := range objs {
			switch o := l.obj.(type) {
			case *v1.Service:
				m, _, err := conv.Service(o)
				if err == nil {
					for _, a := range m.ClusterIPs {
						if unusableVIP(a) != "" {
							t.Fatalf("unusable ClusterIP %s converted", a)
						}
					}
				}
			case *discovery.EndpointSlice:
				m, _, err := conv.EndpointSlice(o)
				if err == nil {
					for _, e := range m.Endpoints {
						if unusableEndpoint(e.Addr) != "" {
							t.Fatalf("unusable endpoint %s converted", e.Addr)
						}
					}
				}
			case *v1.Node:
				conv.Node(o)
			}
		}
	})
}
