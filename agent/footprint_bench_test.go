package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/source"
	"github.com/edgeproxy/edgeproxy/datapath/recorder"
)

// apiService is a Service as a kube-apiserver lists it: labels, a
// selector, the last-applied annotation, managed fields.
func apiService(i int) *v1.Service {
	name := fmt.Sprint("svc-", i)
	ip := fmt.Sprintf("10.96.%d.%d", i>>8&255, i&255)
	single := v1.IPFamilyPolicySingleStack
	cluster := v1.ServiceInternalTrafficPolicyCluster
	labels := map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "shop", "tier": "backend"}
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", UID: types.UID(fmt.Sprintf("3f0c2a4e-0000-4000-8000-%012d", i)),
			ResourceVersion: fmt.Sprint(1000 + i), CreationTimestamp: metav1.NewTime(time.Unix(1700000000, 0)), Labels: labels,
			Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": fmt.Sprintf(
				`{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{},"labels":{"app.kubernetes.io/name":%q},"name":%q,"namespace":"shop"},"spec":{"ports":[{"name":"http","port":80,"targetPort":8080}],"selector":{"app.kubernetes.io/name":%q}}}`, name, name, name)},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl-client-side-apply", Operation: metav1.ManagedFieldsOperationUpdate,
				APIVersion: "v1", FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:annotations":{".":{},"f:kubectl.kubernetes.io/last-applied-configuration":{}},"f:labels":{".":{},"f:app.kubernetes.io/name":{}}},"f:spec":{"f:internalTrafficPolicy":{},"f:ports":{".":{},"k:{\"port\":80,\"protocol\":\"TCP\"}":{".":{},"f:name":{},"f:port":{},"f:protocol":{},"f:targetPort":{}}},"f:selector":{},"f:sessionAffinity":{},"f:type":{}}}`)}}},
		},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip}, Selector: labels,
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol}, IPFamilyPolicy: &single, InternalTrafficPolicy: &cluster,
			SessionAffinity: v1.ServiceAffinityNone,
			Ports:           []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
}

// apiSlice is the EndpointSlice the controller writes for apiService(i),
// with n endpoints.
func apiSlice(i, n int) *discovery.EndpointSlice {
	name := fmt.Sprint("svc-", i)
	port, proto, portName := int32(8080), v1.ProtocolTCP, "http"
	yes, no := true, false
	s := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-x7k2p", GenerateName: name + "-", Namespace: "shop",
			UID: types.UID(fmt.Sprintf("9a1b2c3d-0000-4000-8000-%012d", i)), ResourceVersion: fmt.Sprint(50000 + i),
			CreationTimestamp: metav1.NewTime(time.Unix(1700000000, 0)),
			Labels: map[string]string{discovery.LabelServiceName: name, discovery.LabelManagedBy: "endpointslice-controller.k8s.io",
				"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "shop", "tier": "backend"},
			Annotations:     map[string]string{v1.EndpointsLastChangeTriggerTime: "2026-11-24T10:00:00Z"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: name, UID: "3f0c2a4e", Controller: &yes, BlockOwnerDeletion: &yes}},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate,
				APIVersion: "discovery.k8s.io/v1", FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:addressType":{},"f:endpoints":{},"f:metadata":{"f:annotations":{".":{},"f:endpoints.kubernetes.io/last-change-trigger-time":{}},"f:generateName":{},"f:labels":{".":{},"f:endpointslice.kubernetes.io/managed-by":{},"f:kubernetes.io/service-name":{}},"f:ownerReferences":{".":{},"k:{\"uid\":\"3f0c2a4e\"}":{}}},"f:ports":{}}`)}}},
		},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: &portName, Protocol: &proto, Port: &port}},
	}
	for j := range n {
		node, zone := fmt.Sprint("edge-", j), fmt.Sprint("zone-", j%3)
		s.Endpoints = append(s.Endpoints, discovery.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 128+i>>12, i>>4&255, 16*(i&15)+j)},
			Conditions: discovery.EndpointConditions{Ready: &yes, Serving: &yes, Terminating: &no},
			NodeName:   &node, Zone: &zone,
			TargetRef: &v1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: fmt.Sprintf("%s-7d9f8c6b5-%05d", name, j),
				UID: types.UID(fmt.Sprintf("c0ffee00-0000-4000-8000-%06d%06d", i, j))},
		})
	}
	return s
}

// BenchmarkPeriodicCompare5k is one sync.period compare on a quiet node
// with 5,000 services (mode plan): "kernel-moved" when the datapath cannot
// vouch for its tables (the plan is built again and handed over with Full
// set; the iptables datapath then renders and compares every service, see
// datapath/iptables BenchmarkSync/*/full), "quiet" when it can.
func BenchmarkPeriodicCompare5k(b *testing.B) {
	for _, quiet := range []bool{false, true} {
		name := "kernel-moved"
		if quiet {
			name = "quiet"
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			cfg := config.Default()
			cfg.NodeName, cfg.Manifests, cfg.Mode, cfg.StateDir = "edge-0", b.TempDir(), config.ModePlan, ""
			cfg.Server = config.Server{}
			backend := &watched{}
			a, err := New(Options{Config: &cfg, Backend: backend, Registry: prometheus.NewRegistry(),
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				b.Fatal(err)
			}
			a.state = fill(5000)
			if err := a.sync(ctx); err != nil {
				b.Fatal(err)
			}
			backend.unchanged.Store(quiet)
			applied := len(backend.got())
			for b.Loop() {
				a.lastFull = time.Now().Add(-2 * cfg.Sync.Period)
				if err := a.sync(ctx); err != nil {
					b.Fatal(err)
				}
			}
			if quiet != (len(backend.got()) == applied) {
				b.Fatalf("quiet=%v: %d plans applied", quiet, len(backend.got())-applied)
			}
		})
	}
}

// footprint keeps what BenchmarkFootprint5k built alive until the heap
// profile is written.
var footprint []any

// BenchmarkFootprint5k is the agent's steady memory with 5,000 Services of
// 10 endpoints: API objects as listed, through the informer transform (the
// conversion) into a cache store (what the informers hold) and the state,
// planned and applied once (mode plan). It reports the live heap after a
// GC; run it with -memprofile and `go tool pprof -top -inuse_space` to see
// what is held.
func BenchmarkFootprint5k(b *testing.B) {
	const n = 5000
	for b.Loop() {
		footprint = nil
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)

		cfg := config.Default()
		cfg.NodeName, cfg.Manifests, cfg.Mode, cfg.StateDir = "edge-0", b.TempDir(), config.ModePlan, ""
		cfg.Server = config.Server{}
		a, err := New(Options{Config: &cfg, Backend: recorder.New(), Registry: prometheus.NewRegistry(),
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			b.Fatal(err)
		}
		conv := &source.Converter{KeepPrefix: cfg.ServiceKeyPrefix}
		services := cache.NewStore(cache.MetaNamespaceKeyFunc)
		slices := cache.NewStore(cache.MetaNamespaceKeyFunc)
		for i := range n {
			obj, _ := conv.Transform(apiService(i))
			if err := services.Add(obj); err != nil {
				b.Fatal(err)
			}
			c := obj.(*source.Converted)
			if c.Err != nil {
				b.Fatal(c.Err)
			}
			a.state.SetService("shop/"+c.Meta.Name, c.Service)
			obj, _ = conv.Transform(apiSlice(i, 10))
			if err := slices.Add(obj); err != nil {
				b.Fatal(err)
			}
			if c = obj.(*source.Converted); c.Err != nil {
				b.Fatal(c.Err)
			}
			a.state.SetSlice("shop/"+c.Meta.Name, c.Slice)
		}
		if err := a.sync(context.Background()); err != nil {
			b.Fatal(err)
		}
		footprint = []any{a, services, slices}
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "live-MiB")
	}
}
