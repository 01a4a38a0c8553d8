package source

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// API watches Services, EndpointSlices and this Node on a kube-apiserver.
type API struct {
	conv    *Converter
	sink    Sink
	report  *reporter
	log     *slog.Logger
	factory informers.SharedInformerFactory
	nodes   informers.SharedInformerFactory
	synced  []cache.InformerSynced
	svcInf  cache.SharedIndexInformer
	epsInf  cache.SharedIndexInformer
	// contact is when the last event, list or heartbeat came, in
	// nanoseconds after born (0: never). An offset from a time.Now() keeps
	// Go's monotonic clock: a wall clock stepped back or forward does not
	// make the API server look heard from in the future (which stopped the
	// heartbeat for as long as the step) or long gone.
	contact  atomic.Int64
	born     time.Time
	nodeName string
	client   kubernetes.Interface
	down     atomic.Bool   // the last heartbeat failed
	reach    chan struct{} // capacity 1: down changed (see ReachabilityChanged)
}

// Heartbeat timing: when nothing arrived for quietAfter, the API source asks
// the API server's /readyz (readable by every authenticated user), so that
// last contact tells a quiet cluster from an unreachable one. At most one
// small request per quietAfter per node. The heartbeat sleeps until the
// last contact is quietAfter old (no fixed poll; see heartbeatGrid); before
// the first contact and while the API server does not answer it asks every
// heartbeatCheck.
const (
	quietAfter     = 10 * time.Second
	heartbeatCheck = 3 * time.Second
)

// NewAPI prepares informers; nothing is started until Run.
func NewAPI(client kubernetes.Interface, nodeName string, conv *Converter, sink Sink, log *slog.Logger, m *Metrics) (*API, error) {
	a := &API{conv: conv, sink: sink, log: log, report: newReporter(log, m), nodeName: nodeName, client: client, born: time.Now(),
		reach: make(chan struct{}, 1)}
	// No periodic informer resync: the sync runner owns timing.
	a.factory = informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(conv.Strip))
	a.nodes = informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(conv.Strip),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", nodeName).String()
		}))

	svc := a.factory.Core().V1().Services().Informer()
	eps := a.factory.Discovery().V1().EndpointSlices().Informer()
	node := a.nodes.Core().V1().Nodes().Informer()
	a.svcInf, a.epsInf = svc, eps
	for _, h := range []struct {
		inf cache.SharedIndexInformer
		fn  func(key string, obj any)
	}{{svc, a.onService}, {eps, a.onSlice}, {node, a.onNode}} {
		fn := h.fn
		reg, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { a.touch(); fn(keyOf(obj), obj) },
			UpdateFunc: func(_, obj any) { a.touch(); fn(keyOf(obj), obj) },
			DeleteFunc: func(obj any) {
				a.touch()
				if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
					fn(d.Key, nil)
					return
				}
				fn(keyOf(obj), nil)
			},
		})
		if err != nil {
			return nil, fmt.Errorf("source: add event handler: %w", err)
		}
		// Synced when our handler has been given every listed object, not
		// merely when the informer's store holds them: the first sync must
		// see the whole list, or it programs a part of it (services
		// without their endpoints) until the next.
		a.synced = append(a.synced, reg.HasSynced)
		if err := h.inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
			log.Warn("watch failed; retrying", "err", err)
		}); err != nil {
			return nil, fmt.Errorf("source: set watch error handler: %w", err)
		}
	}
	return a, nil
}

// Run starts the informers and returns when ctx is done.
func (a *API) Run(ctx context.Context) error {
	a.factory.Start(ctx.Done())
	a.nodes.Start(ctx.Done())
	a.heartbeat(ctx)
	a.factory.Shutdown()
	a.nodes.Shutdown()
	return nil
}

// heartbeat asks the API server whether it is there when the watches have
// been quiet, until ctx is done, and logs when it goes away and comes back.
func (a *API) heartbeat(ctx context.Context) {
	t := time.NewTimer(heartbeatCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if wait := a.quietIn(time.Now()); wait > 0 {
			t.Reset(onGrid(time.Now(), wait))
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := a.client.Discovery().RESTClient().Get().AbsPath("/readyz").Do(rctx).Error()
		cancel()
		switch {
		case err == nil:
			back := a.down.Load()
			a.touch()
			if back {
				a.log.Info("the API server answers again")
			}
		case ctx.Err() != nil:
			return
		case a.setDown(true):
			a.log.Warn("the API server does not answer; keeping the rules in place", "err", err)
		}
		if wait := a.quietIn(time.Now()); wait > 0 {
			t.Reset(onGrid(time.Now(), wait))
		} else {
			t.Reset(heartbeatCheck) // no answer: ask again soon
		}
	}
}

// heartbeatGrid: a quiet heartbeat wakes on multiples of it on the wall
// clock, as the agent's tamper monitor does, so that the two cost one
// wake-up of the process (each costs dozens of context switches while the
// Go runtime's monitor thread winds down). A quiet cluster is then asked
// every 10 to 20 seconds.
const heartbeatGrid = 10 * time.Second

// onGrid is the wait from now until the first multiple of heartbeatGrid at
// least d away.
func onGrid(now time.Time, d time.Duration) time.Duration {
	at := now.Add(d)
	if r := at.Truncate(heartbeatGrid); r.Equal(at) {
		return d
	}
	return at.Truncate(heartbeatGrid).Add(heartbeatGrid).Sub(now)
}

// quietIn is how long until the API server has been quiet for quietAfter
// (at most 0: it has, or it was never heard from).
func (a *API) quietIn(now time.Time) time.Duration {
	last := a.LastContact()
	if last.IsZero() || a.down.Load() {
		return 0
	}
	return quietAfter - now.Sub(last)
}

// setDown records whether the API server answers and reports whether that
// changed; a change is signalled on ReachabilityChanged.
func (a *API) setDown(down bool) bool {
	if a.down.Swap(down) == down {
		return false
	}
	select {
	case a.reach <- struct{}{}:
	default: // a signal is already pending
	}
	return true
}

// ReachabilityChanged receives (coalesced) when Reachable changes.
func (a *API) ReachabilityChanged() <-chan struct{} { return a.reach }

// Reachable reports whether the last heartbeat (if any) got an answer.
func (a *API) Reachable() bool { return !a.down.Load() }

// WaitForSync blocks until every informer has listed once, or ctx ends.
func (a *API) WaitForSync(ctx context.Context) bool {
	// client-go's WaitForCacheSync looks every 100 ms: on average 50 ms
	// added to every cold start. A look is a few atomic loads.
	t := time.NewTicker(syncedPoll)
	defer t.Stop()
	for {
		if synced(a.synced) {
			a.touch()
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// syncedPoll is how often WaitForSync looks whether every informer has
// listed; it polls only until they have.
const syncedPoll = 5 * time.Millisecond

func synced(fns []cache.InformerSynced) bool {
	for _, f := range fns {
		if !f() {
			return false
		}
	}
	return true
}

// Keys lists the Services and EndpointSlices the API server has, as
// "namespace/name", once WaitForSync returned true. After a start from the
// on-disk snapshot, everything else the state holds is gone from the API.
func (a *API) Keys() (services, slices map[string]bool) {
	services, slices = make(map[string]bool), make(map[string]bool)
	for _, k := range a.svcInf.GetStore().ListKeys() {
		services[k] = true
	}
	for _, k := range a.epsInf.GetStore().ListKeys() {
		slices[k] = true
	}
	return services, slices
}

// LastContact is when the API last delivered anything.
func (a *API) LastContact() time.Time {
	n := a.contact.Load()
	if n == 0 {
		return time.Time{}
	}
	return a.born.Add(time.Duration(n))
}

func (a *API) touch() {
	a.contact.Store(max(1, int64(time.Since(a.born))))
	if a.down.Load() {
		a.setDown(false)
	}
}

func (a *API) onService(key string, obj any) {
	s, _ := obj.(*v1.Service)
	if s == nil {
		a.report.clear("Service", key)
		a.sink.SetService(key, nil)
		return
	}
	m, err := a.conv.Service(s)
	if err != nil {
		a.report.problem("Service", key, err)
		a.sink.SetService(key, nil)
		return
	}
	a.report.clear("Service", key)
	a.sink.SetService(key, m)
}

func (a *API) onSlice(key string, obj any) {
	s, _ := obj.(*discovery.EndpointSlice)
	if s == nil {
		a.report.clear("EndpointSlice", key)
		a.sink.SetSlice(key, nil)
		return
	}
	m, warnings, err := a.conv.EndpointSlice(s)
	if err != nil {
		a.report.problem("EndpointSlice", key, err)
		a.sink.SetSlice(key, nil)
		return
	}
	a.report.warnings("EndpointSlice", key, warnings)
	a.sink.SetSlice(key, m)
}

func (a *API) onNode(_ string, obj any) {
	n, _ := obj.(*v1.Node)
	if n == nil {
		a.log.Warn("this node's Node object was deleted; keeping its last known labels", "node", a.nodeName)
		return
	}
	a.sink.SetNode(a.conv.Node(n))
}

func keyOf(obj any) string {
	k, err := cache.MetaNamespaceKeyFunc(obj)
	if err != nil {
		return fmt.Sprintf("%T", obj)
	}
	return k
}

// Strip drops what the proxy never reads before an informer caches the
// object, so that the cache holds only the fields the converter reads (see
// Service, EndpointSlice and Node) and what the informer itself needs
// (name, namespace, UID, resourceVersion). Memory on small edge nodes
// matters: a listed EndpointSlice is mostly managed fields, pod references
// and labels copied from its Service. TestStripChangesNoConversion holds
// it to the converter.
func (c *Converter) Strip(obj any) (any, error) {
	acc, ok := obj.(metav1.Object)
	if !ok {
		return obj, nil
	}
	acc.SetManagedFields(nil)
	acc.SetOwnerReferences(nil)
	acc.SetFinalizers(nil)
	acc.SetGenerateName("")
	if ann := acc.GetAnnotations(); len(ann) > 0 {
		kept := make(map[string]string)
		for k, v := range ann {
			if keepAnnotation(k, c.KeepPrefix) {
				kept[k] = v
			}
		}
		acc.SetAnnotations(kept)
	}
	switch o := obj.(type) {
	case *v1.Service:
		stripService(o)
	case *discovery.EndpointSlice:
		stripSlice(o)
	case *v1.Node:
		// Taints, addresses and labels are read; the rest of spec and
		// status (images, conditions, capacity, volumes) is not.
		o.Spec = v1.NodeSpec{Taints: o.Spec.Taints}
		o.Status = v1.NodeStatus{Addresses: o.Status.Addresses}
	}
	return obj, nil
}

// stripService keeps labels (policy chains match on them) and the spec
// and status fields the converter reads.
func stripService(s *v1.Service) {
	sp := &s.Spec
	sp.Selector = nil
	sp.IPFamilies, sp.IPFamilyPolicy = nil, nil
	sp.LoadBalancerIP, sp.LoadBalancerClass, sp.AllocateLoadBalancerNodePorts = "", nil, nil
	sp.ExternalName = ""
	for i := range sp.Ports {
		sp.Ports[i].TargetPort, sp.Ports[i].AppProtocol = intstr.IntOrString{}, nil
	}
	s.Status.Conditions = nil
	for i := range s.Status.LoadBalancer.Ingress {
		ing := &s.Status.LoadBalancer.Ingress[i]
		ing.Hostname, ing.Ports = "", nil
	}
}

// stripSlice keeps the service-name label, and of each endpoint the first
// address (the only one used), its conditions, node, zone and hints.
func stripSlice(s *discovery.EndpointSlice) {
	if name, ok := s.Labels[LabelServiceName]; ok {
		s.Labels = map[string]string{LabelServiceName: name}
	} else {
		s.Labels = nil
	}
	for i := range s.Ports {
		s.Ports[i].AppProtocol = nil
	}
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if len(e.Addresses) > 1 {
			e.Addresses = e.Addresses[:1:1]
		}
		e.Hostname, e.TargetRef, e.DeprecatedTopology = nil, nil, nil
	}
}
