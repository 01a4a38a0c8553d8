package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const (
	servicePort  = 80
	endpointPort = 8080
	// triggerAnnotation is what the EndpointSlice controller stamps; both
	// proxies measure network programming latency from it.
	triggerAnnotation = "endpoints.kubernetes.io/last-change-trigger-time"
)

// Driver writes the scenario into the API server the way the EndpointSlice
// controller would: selector-less Services, and one EndpointSlice each,
// written directly with the trigger-time annotation.
type Driver struct {
	client    kubernetes.Interface
	Namespace string
	Services  int // created so far
	Endpoints int // per service

	mu     sync.Mutex
	slices []*discoveryv1.EndpointSlice // current object of service i
	next   uint32                       // next fresh endpoint address (for flips)
}

// NewDriver returns a driver with a client that is not rate limited.
func NewDriver(cfg *rest.Config, namespace string, endpoints int) (*Driver, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 5000, 10000
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if endpoints < 1 || endpoints > 16 {
		return nil, fmt.Errorf("bench: %d endpoints per service: want 1..16", endpoints)
	}
	return &Driver{client: c, Namespace: namespace, Endpoints: endpoints,
		next: ip4(netip.MustParseAddr("10.64.0.0"))}, nil
}

func ip4(a netip.Addr) uint32 { b := a.As4(); return binary.BigEndian.Uint32(b[:]) }

func addr4(v uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// endpointAddr is endpoint j of service i: 10.128.0.0/9, 16 per service.
func endpointAddr(i, j int) netip.Addr {
	return addr4(ip4(netip.MustParseAddr("10.128.0.0")) + uint32(i)*16 + uint32(j))
}

// Expected is every endpoint destination the objects hold now.
func (d *Driver) Expected() map[Dest]struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := make(map[Dest]struct{}, len(d.slices)*d.Endpoints)
	for _, s := range d.slices {
		for _, e := range s.Endpoints {
			m[DestOf(netip.AddrPortFrom(netip.MustParseAddr(e.Addresses[0]), endpointPort))] = struct{}{}
		}
	}
	return m
}

func serviceName(i int) string { return fmt.Sprintf("svc-%05d", i) }

func (d *Driver) slice(i int, addrs []netip.Addr, trigger time.Time) *discoveryv1.EndpointSlice {
	port, proto, name := int32(endpointPort), corev1.ProtocolTCP, "http"
	ready := true
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:      serviceName(i) + "-bench",
			Namespace: d.Namespace,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: serviceName(i),
				discoveryv1.LabelManagedBy:   "bench-driver.edgeproxy.io",
			},
			Annotations: map[string]string{triggerAnnotation: trigger.UTC().Format(time.RFC3339Nano)},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
	}
	for j, a := range addrs {
		node := fmt.Sprintf("worker-%d", (i+j)%50)
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{a.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			NodeName:   &node,
		})
	}
	return s
}

// Grow creates Services and their EndpointSlices (with parallel writers)
// until there are n; the first call also creates the namespace. Sizes of a
// run grow, so one API server serves them all.
func (d *Driver) Grow(ctx context.Context, n int) error {
	if d.slices == nil {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: d.Namespace}}
		if _, err := d.client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("bench: namespace %s: %w", d.Namespace, err)
		}
	}
	have := len(d.slices)
	if n <= have {
		return nil
	}
	d.slices = append(d.slices, make([]*discoveryv1.EndpointSlice, n-have)...)
	d.Services = n
	return parallel(ctx, n-have, 16, func(ctx context.Context, k int) error {
		i := have + k
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: serviceName(i), Namespace: d.Namespace},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: servicePort,
				TargetPort: intstr.FromInt32(endpointPort)}}},
		}
		if _, err := d.client.CoreV1().Services(d.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("bench: service %s: %w", svc.Name, err)
		}
		addrs := make([]netip.Addr, d.Endpoints)
		for j := range addrs {
			addrs[j] = endpointAddr(i, j)
		}
		s, err := d.client.DiscoveryV1().EndpointSlices(d.Namespace).Create(ctx, d.slice(i, addrs, time.Now()), metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("bench: endpointslice of %s: %w", svc.Name, err)
		}
		d.mu.Lock()
		d.slices[i] = s
		d.mu.Unlock()
		return nil
	})
}

// Version is the resource version of service i's EndpointSlice as last
// written.
func (d *Driver) Version(i int) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.slices[i].ResourceVersion
}

// Flip replaces endpoint j of service i with a fresh address, as when a pod
// is rescheduled, and returns the new destination. The write time is taken
// just before the API call.
func (d *Driver) Flip(ctx context.Context, i, j int) (added Dest, wrote time.Time, err error) {
	d.mu.Lock()
	cur := d.slices[i]
	fresh := addr4(d.next)
	d.next++
	d.mu.Unlock()
	addrs := make([]netip.Addr, len(cur.Endpoints))
	for k, e := range cur.Endpoints {
		addrs[k] = netip.MustParseAddr(e.Addresses[0])
	}
	addrs[j] = fresh
	wrote = time.Now()
	s := d.slice(i, addrs, wrote)
	s.ResourceVersion = cur.ResourceVersion
	got, err := d.client.DiscoveryV1().EndpointSlices(d.Namespace).Update(ctx, s, metav1.UpdateOptions{})
	if err != nil {
		return 0, wrote, fmt.Errorf("bench: update endpointslice of %s: %w", serviceName(i), err)
	}
	d.mu.Lock()
	d.slices[i] = got
	d.mu.Unlock()
	return DestOf(netip.AddrPortFrom(fresh, endpointPort)), wrote, nil
}

// parallel runs fn(0..n-1) on workers goroutines; the first error stops it.
func parallel(ctx context.Context, n, workers int, fn func(context.Context, int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	idx := make(chan int)
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range idx {
				if err := fn(ctx, i); err != nil {
					errc <- err
					cancel()
					return
				}
			}
		}()
	}
feed:
	for i := range n {
		select {
		case idx <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(idx)
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return ctx.Err()
	}
}

// Clear deletes every Service and EndpointSlice the driver wrote (the
// namespace stays), so that a later scenario starts from nothing.
func (d *Driver) Clear(ctx context.Context) error {
	n := len(d.slices)
	err := parallel(ctx, n, 16, func(ctx context.Context, i int) error {
		if err := d.client.DiscoveryV1().EndpointSlices(d.Namespace).Delete(ctx, serviceName(i)+"-bench", metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("bench: delete endpointslice of %s: %w", serviceName(i), err)
		}
		if err := d.client.CoreV1().Services(d.Namespace).Delete(ctx, serviceName(i), metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("bench: delete service %s: %w", serviceName(i), err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	d.slices, d.Services = d.slices[:0], 0
	return nil
}

// Labels the EndpointSlice controller gives a headless Service's slices,
// and the label that gives a Service (and, copied, its slices) to another
// proxy.
const (
	labelHeadless  = corev1.IsHeadlessService
	labelProxyName = "service.kubernetes.io/service-proxy-name"
)

// WriteIgnored adds, next to the driver's Services, n headless Services
// and m Services for another proxy (service-proxy-name=other), each with
// one EndpointSlice of d.Endpoints endpoints labelled as the EndpointSlice
// controller labels them (the headless label; the Service's labels
// copied). No proxy here programs them: kube-proxy's selectors keep them
// off the link. Their endpoints are in 10.200.0.0/16, outside Expected.
func (d *Driver) WriteIgnored(ctx context.Context, n, m int) error {
	return parallel(ctx, n+m, 16, func(ctx context.Context, k int) error {
		name, labels, clusterIP := fmt.Sprintf("headless-%05d", k), map[string]string{}, corev1.ClusterIPNone
		sliceLabels := map[string]string{labelHeadless: ""}
		if k >= n {
			name, clusterIP = fmt.Sprintf("other-%05d", k-n), ""
			labels = map[string]string{labelProxyName: "other"}
			sliceLabels = map[string]string{labelProxyName: "other"}
		}
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: d.Namespace, Labels: labels},
			Spec: corev1.ServiceSpec{ClusterIP: clusterIP, Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: servicePort,
				TargetPort: intstr.FromInt32(endpointPort)}}},
		}
		if _, err := d.client.CoreV1().Services(d.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("bench: service %s: %w", name, err)
		}
		addrs := make([]netip.Addr, d.Endpoints)
		for j := range addrs {
			addrs[j] = addr4(ip4(netip.MustParseAddr("10.200.0.0")) + uint32(k)*16 + uint32(j))
		}
		s := d.slice(0, addrs, time.Now())
		s.Name = name + "-bench"
		s.Labels[discoveryv1.LabelServiceName] = name
		for k, v := range sliceLabels {
			s.Labels[k] = v
		}
		if _, err := d.client.DiscoveryV1().EndpointSlices(d.Namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("bench: endpointslice of %s: %w", name, err)
		}
		return nil
	})
}

// ClearIgnored deletes what WriteIgnored(n, m) wrote.
func (d *Driver) ClearIgnored(ctx context.Context, n, m int) error {
	return parallel(ctx, n+m, 16, func(ctx context.Context, k int) error {
		name := fmt.Sprintf("headless-%05d", k)
		if k >= n {
			name = fmt.Sprintf("other-%05d", k-n)
		}
		if err := d.client.DiscoveryV1().EndpointSlices(d.Namespace).Delete(ctx, name+"-bench", metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("bench: delete endpointslice of %s: %w", name, err)
		}
		if err := d.client.CoreV1().Services(d.Namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("bench: delete service %s: %w", name, err)
		}
		return nil
	})
}

// Shrink deletes the Services (and their EndpointSlices) beyond the first
// n, the last ones written.
func (d *Driver) Shrink(ctx context.Context, n int) error {
	have := len(d.slices)
	if n >= have {
		return nil
	}
	err := parallel(ctx, have-n, 16, func(ctx context.Context, k int) error {
		i := n + k
		if err := d.client.DiscoveryV1().EndpointSlices(d.Namespace).Delete(ctx, serviceName(i)+"-bench", metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("bench: delete endpointslice of %s: %w", serviceName(i), err)
		}
		if err := d.client.CoreV1().Services(d.Namespace).Delete(ctx, serviceName(i), metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("bench: delete service %s: %w", serviceName(i), err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.slices, d.Services = d.slices[:n], n
	d.mu.Unlock()
	return nil
}
