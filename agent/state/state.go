// Package state folds source changes into the current view of services and
// endpoints, remembers which service ports changed since the last snapshot,
// and yields immutable Snapshots with increasing generations.
//
// Updates that change nothing the proxy reads are dropped on arrival: the
// source has already reduced objects to model values, so comparing those
// values is the no-op check. Only the services touched since the previous
// snapshot are recomputed; the others are shared with it.
package state

import (
	"cmp"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/edgeproxy/edgeproxy/agent/model"
)

// Port is one service port with its endpoints, merged across the service's
// slices. Values are shared between snapshots and must not be modified.
type Port struct {
	Name    model.ServicePortName
	Service *model.Service
	Port    model.ServicePort
	// V4 and V6 are the endpoints of each family, de-duplicated by
	// address:port and sorted by address. They point into the slices'
	// endpoints (model.PortEndpoint).
	V4, V6 []model.PortEndpoint
}

// Endpoints returns the endpoints of family f.
func (p *Port) Endpoints(f model.Family) []model.PortEndpoint {
	if f == model.IPv6 {
		return p.V6
	}
	return p.V4
}

// Snapshot is the state at one moment.
type Snapshot struct {
	Generation uint64
	Node       *model.Node // nil until the node is known
	Ports      map[model.ServicePortName]*Port
	// Changed holds the service ports added, removed or modified since the
	// previous snapshot. NodeChanged means every port must be re-evaluated
	// (topology and locality depend on the node).
	Changed     map[model.ServicePortName]bool
	NodeChanged bool
	// Oldest is when the oldest change included in this snapshot arrived;
	// zero when nothing changed. TriggerTimes lists the slices'
	// last-change-trigger-times of the included changes.
	Oldest       time.Time
	TriggerTimes []time.Time
}

// Counters reports how many changes of each kind arrived, and how many
// Services have Service or endpoint changes not yet in a snapshot
// (kube-proxy's *_changes_pending).
type Counters struct {
	ServiceChanges, EndpointChanges   uint64
	ServicesPending, EndpointsPending int
}

// State is safe for concurrent use: sources write, the sync loop snapshots.
type State struct {
	mu       sync.Mutex
	services map[string]*model.Service
	slices   map[string]*model.EndpointSlice
	bySvc    map[string][]keyedSlice // service key → its slices, sorted by key
	node     *model.Node

	dirty       map[string]bool // service keys touched since the last snapshot
	dirtySvc    map[string]bool // of those, by a Service change
	dirtyEp     map[string]bool // of those, by an EndpointSlice change
	nodeChanged bool
	oldest      time.Time
	triggers    []time.Time
	counters    Counters
	last        *Snapshot
	portsOf     map[string][]model.ServicePortName // service key → its ports in last
	notify      func()
	now         func() time.Time
}

// New returns an empty state. notify, if not nil, is called (outside the
// lock) after every change that was not a no-op; the agent uses it to poke
// the sync runner.
func New(notify func()) *State {
	return &State{
		services: make(map[string]*model.Service),
		slices:   make(map[string]*model.EndpointSlice),
		bySvc:    make(map[string][]keyedSlice),
		dirty:    make(map[string]bool),
		dirtySvc: make(map[string]bool),
		dirtyEp:  make(map[string]bool),
		portsOf:  make(map[string][]model.ServicePortName),
		notify:   notify,
		now:      time.Now,
		last:     &Snapshot{Ports: map[model.ServicePortName]*Port{}},
	}
}

// SetService records a Service; nil deletes it.
func (s *State) SetService(key string, svc *model.Service) {
	s.mu.Lock()
	old := s.services[key]
	if reflect.DeepEqual(old, svc) {
		s.mu.Unlock()
		return
	}
	if svc == nil {
		delete(s.services, key)
	} else {
		s.services[key] = svc
	}
	s.counters.ServiceChanges++
	s.markLocked(key)
	s.dirtySvc[key] = true
	s.mu.Unlock()
	s.poke()
}

// SetSlice records an EndpointSlice; nil deletes it.
func (s *State) SetSlice(key string, sl *model.EndpointSlice) {
	s.mu.Lock()
	old := s.slices[key]
	if reflect.DeepEqual(old, sl) {
		s.mu.Unlock()
		return
	}
	if old != nil {
		svcKey := old.Namespace + "/" + old.Service
		if l := withoutSlice(s.bySvc[svcKey], key); len(l) == 0 {
			delete(s.bySvc, svcKey)
		} else {
			s.bySvc[svcKey] = l
		}
		s.markLocked(svcKey)
		s.dirtyEp[svcKey] = true
	}
	if sl == nil {
		delete(s.slices, key)
	} else {
		s.slices[key] = sl
		svcKey := sl.Namespace + "/" + sl.Service
		s.bySvc[svcKey] = withSlice(s.bySvc[svcKey], key, sl)
		s.markLocked(svcKey)
		s.dirtyEp[svcKey] = true
		if !sl.TriggerTime.IsZero() {
			s.triggers = append(s.triggers, sl.TriggerTime)
		}
	}
	s.counters.EndpointChanges++
	s.mu.Unlock()
	s.poke()
}

// SetNode records this node.
func (s *State) SetNode(n *model.Node) {
	s.mu.Lock()
	if reflect.DeepEqual(s.node, n) {
		s.mu.Unlock()
		return
	}
	s.node = n
	s.nodeChanged = true
	if s.oldest.IsZero() {
		s.oldest = s.now()
	}
	s.mu.Unlock()
	s.poke()
}

func (s *State) markLocked(svcKey string) {
	s.dirty[svcKey] = true
	if s.oldest.IsZero() {
		s.oldest = s.now()
	}
}

func (s *State) poke() {
	if s.notify != nil {
		s.notify()
	}
}

// Retain deletes every Service and EndpointSlice whose key is not in the
// given sets. After a start from the on-disk snapshot, the agent calls it
// (reconcileAfterOffline) once the API source has listed everything: objects
// deleted while the agent was offline never produce a delete event.
func (s *State) Retain(services, slices map[string]bool) (removed int) {
	s.mu.Lock()
	var drop, dropSlices []string
	for k := range s.services {
		if !services[k] {
			drop = append(drop, k)
		}
	}
	for k := range s.slices {
		if !slices[k] {
			dropSlices = append(dropSlices, k)
		}
	}
	s.mu.Unlock()
	for _, k := range drop {
		s.SetService(k, nil)
	}
	for _, k := range dropSlices {
		s.SetSlice(k, nil)
	}
	return len(drop) + len(dropSlices)
}

// Pending reports when the oldest change not yet in a snapshot arrived (zero
// when there is none).
func (s *State) Pending() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.oldest
}

// Counters returns the change counters.
func (s *State) Counters() Counters {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.counters
	c.ServicesPending, c.EndpointsPending = len(s.dirtySvc), len(s.dirtyEp)
	return c
}

// Objects returns copies of the current services and slices, sorted by
// key, for writing the on-disk snapshot.
func (s *State) Objects() (node *model.Node, services []model.Service, sl []model.EndpointSlice) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range sortedKeys(s.services) {
		services = append(services, *s.services[k])
	}
	for _, k := range sortedKeys(s.slices) {
		sl = append(sl, *s.slices[k])
	}
	if s.node != nil {
		n := *s.node
		node = &n
	}
	return node, services, sl
}

// Snapshot folds the pending changes into a new snapshot. Without pending
// changes it returns the previous snapshot's content under the same
// generation with an empty Changed set.
func (s *State) Snapshot() *Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.last
	if len(s.dirty) == 0 && !s.nodeChanged {
		return &Snapshot{Generation: prev.Generation, Node: prev.Node, Ports: prev.Ports, Changed: map[model.ServicePortName]bool{}}
	}
	next := &Snapshot{
		Generation:   prev.Generation + 1,
		Node:         s.node,
		Changed:      make(map[model.ServicePortName]bool),
		NodeChanged:  s.nodeChanged,
		Oldest:       s.oldest,
		TriggerTimes: s.triggers,
	}
	// Every step is per dirty service, through the index of the ports each
	// service had in the previous snapshot: a cold start with every service
	// dirty costs one pass over the ports, not one per service.
	next.Ports = maps.Clone(prev.Ports)
	for key := range s.dirty {
		old := s.portsOf[key]
		for _, name := range old {
			delete(next.Ports, name)
		}
		built := s.buildLocked(key)
		names := make([]model.ServicePortName, 0, len(built))
		for name, q := range built {
			next.Ports[name] = q
			names = append(names, name)
			// A port is changed when it appeared or differs...
			if p, ok := prev.Ports[name]; !ok || !reflect.DeepEqual(p, q) {
				next.Changed[name] = true
			}
		}
		for _, name := range old {
			if _, ok := built[name]; !ok { // ... or disappeared.
				next.Changed[name] = true
			}
		}
		if len(names) == 0 {
			delete(s.portsOf, key)
		} else {
			s.portsOf[key] = names
		}
	}
	// New sets, not cleared ones: a cleared map keeps its size, and the
	// cold start's sets hold every service.
	s.dirty, s.dirtySvc, s.dirtyEp = make(map[string]bool), make(map[string]bool), make(map[string]bool)
	s.nodeChanged = false
	s.oldest = time.Time{}
	s.triggers = nil
	// The next snapshot needs only the ports and the node of this one,
	// not its changes (every port, after a cold start).
	s.last = &Snapshot{Generation: next.Generation, Node: next.Node, Ports: next.Ports}
	return next
}

// buildLocked computes the ports of one service from its slices.
func (s *State) buildLocked(svcKey string) map[model.ServicePortName]*Port {
	svc := s.services[svcKey]
	if svc == nil {
		return nil
	}
	out := make(map[model.ServicePortName]*Port, len(svc.Ports))
	for _, sp := range svc.Ports {
		name := model.ServicePortName{Namespace: svc.Namespace, Name: svc.Name, Port: sp.Name}
		p := &Port{Name: name, Service: svc, Port: sp}
		p.V4, p.V6 = mergeEndpoints(s.bySvc[svcKey], sp)
		out[name] = p
	}
	return out
}

// mergeEndpoints collects the endpoints of one service port from all slices:
// the slice port with the same name and protocol gives the target port. An
// address:port seen in more than one slice (as during a slice migration) is
// kept once, preferring the entry that is ready, then serving.
func mergeEndpoints(sl []keyedSlice, sp model.ServicePort) (v4, v6 []model.PortEndpoint) {
	// The lists are kept until the service changes: sized once, not grown
	// by append (which left up to half of each unused).
	var n4, n6 int
	for _, ks := range sl {
		slice := ks.slice
		for _, port := range slice.Ports {
			if port.Name == sp.Name && port.Protocol == sp.Protocol {
				if slice.Family == model.IPv6 {
					n6 += len(slice.Endpoints)
				} else {
					n4 += len(slice.Endpoints)
				}
			}
		}
	}
	if n4 > 0 {
		v4 = make([]model.PortEndpoint, 0, n4)
	}
	if n6 > 0 {
		v6 = make([]model.PortEndpoint, 0, n6)
	}
	seen := make(map[netip.AddrPort]int, max(n4, n6))
	add := func(list *[]model.PortEndpoint, pe model.PortEndpoint) {
		k := netip.AddrPortFrom(pe.Addr, pe.Port)
		if i, dup := seen[k]; dup {
			if better(pe.Endpoint, (*list)[i].Endpoint) {
				(*list)[i] = pe
			}
			return
		}
		seen[k] = len(*list)
		*list = append(*list, pe)
	}
	for _, ks := range sl {
		slice := ks.slice
		for _, port := range slice.Ports {
			if port.Name != sp.Name || port.Protocol != sp.Protocol {
				continue
			}
			for j := range slice.Endpoints {
				pe := model.PortEndpoint{Endpoint: &slice.Endpoints[j], Port: port.Port}
				if slice.Family == model.IPv6 {
					add(&v6, pe)
				} else {
					add(&v4, pe)
				}
			}
		}
	}
	byAddr := func(a, b model.PortEndpoint) int {
		return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port))
	}
	slices.SortFunc(v4, byAddr)
	slices.SortFunc(v6, byAddr)
	return v4, v6
}

// keyedSlice is an EndpointSlice under its key, in a service's list of
// slices. The list is sorted by key, so that merging takes the slices in
// a stable order; a service has one or a few, and a map each cost more
// than the slices' list at 5,000 services.
type keyedSlice struct {
	key   string
	slice *model.EndpointSlice
}

func byKey(ks keyedSlice, key string) int { return cmp.Compare(ks.key, key) }

// withSlice returns l with sl under key, added or replaced.
func withSlice(l []keyedSlice, key string, sl *model.EndpointSlice) []keyedSlice {
	i, found := slices.BinarySearchFunc(l, key, byKey)
	if found {
		l[i].slice = sl
		return l
	}
	return slices.Insert(l, i, keyedSlice{key: key, slice: sl})
}

// withoutSlice returns l without the slice under key.
func withoutSlice(l []keyedSlice, key string) []keyedSlice {
	if i, found := slices.BinarySearchFunc(l, key, byKey); found {
		return slices.Delete(l, i, i+1)
	}
	return l
}

func better(a, b *model.Endpoint) bool {
	if a.Ready != b.Ready {
		return a.Ready
	}
	return a.Serving && !b.Serving
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
