// Package source turns API objects — from a kube-apiserver watch or from a
// directory of manifests — into model values handed to a Sink. It is the
// only package that imports client-go informers. Objects the proxy cannot use
// are skipped, logged once and counted; nothing here stops on a bad object.
package source

import (
	"cmp"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/model"
)

// Sink receives the converted objects. A nil value deletes the key. Keys are
// "namespace/name" of the API object.
type Sink interface {
	SetService(key string, s *model.Service)
	SetSlice(key string, s *model.EndpointSlice)
	SetNode(n *model.Node)
}

// Metrics counts what the sources skip.
type Metrics struct {
	Skipped *prometheus.CounterVec // kind, reason: bad|ignored|duplicate
}

// NewMetrics registers the source metrics on reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{Skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "edgeproxy_source_objects_skipped_total",
		Help: "API objects or parts of them that were skipped, by kind and reason (bad: could not be used; ignored: not for this proxy).",
	}, []string{"kind", "reason"})}
	if reg != nil {
		reg.MustRegister(m.Skipped)
	}
	return m
}

// Problem is an input the source could not use, whole or in part, as it
// was logged: what status and explain show.
type Problem struct {
	Kind   string `json:"kind"`   // Service, EndpointSlice or manifest
	Object string `json:"object"` // "namespace/name", or the manifest file
	Reason string `json:"reason"`
	// Partly: the object is used without the parts Reason names.
	Partly bool `json:"partly,omitempty"`
}

// reporter logs a problem with an object once (again only when the problem
// changes, or after the object was fine) and counts every occurrence. It
// keeps the problems standing now (bad objects, ignored parts, duplicates;
// not objects that are not for this proxy) for Problems.
type reporter struct {
	log     *slog.Logger
	metrics *Metrics
	mu      sync.Mutex
	last    map[string]string  // id → last message logged
	current map[string]Problem // id → the problem standing now
	// touched is the ids reported since begin, while a manifest load
	// runs; nil otherwise.
	touched map[string]bool
}

func newReporter(log *slog.Logger, m *Metrics) *reporter {
	if m == nil {
		m = NewMetrics(nil)
	}
	return &reporter{log: log, metrics: m, last: map[string]string{}, current: map[string]Problem{}}
}

// problem records err for the object; ignored objects (ErrSkip) are logged
// at debug, bad ones at warn.
func (r *reporter) problem(kind, key string, err error) {
	reason, level := "bad", slog.LevelWarn
	if errors.Is(err, ErrSkip) {
		reason, level = "ignored", slog.LevelDebug
	}
	r.metrics.Skipped.WithLabelValues(kind, reason).Inc()
	p := Problem{Kind: kind, Object: key, Reason: err.Error()}
	if r.record(kind+"/"+key, p, reason == "bad") {
		r.log.Log(nil, level, "skipping object", "kind", kind, "object", key, "reason", p.Reason)
	}
}

// warnings records problems with parts of an object that was still used;
// none clears what was recorded for the object.
func (r *reporter) warnings(kind, key string, ws []string) {
	if len(ws) == 0 {
		r.clear(kind, key)
		return
	}
	r.metrics.Skipped.WithLabelValues(kind+"-part", "bad").Add(float64(len(ws)))
	p := Problem{Kind: kind, Object: key, Reason: strings.Join(ws, "; "), Partly: true}
	if r.record(kind+"/"+key, p, true) {
		r.log.Warn("skipping parts of object", "kind", kind, "object", key, "reasons", p.Reason)
	}
}

// duplicate records an object defined more than once in the manifests (in
// two files or twice in one): counted every time, logged once.
func (r *reporter) duplicate(kind, key string, err error) {
	r.metrics.Skipped.WithLabelValues(kind, "duplicate").Inc()
	if r.record("duplicate "+kind+"/"+key, Problem{Kind: kind, Object: key, Reason: err.Error(), Partly: true}, true) {
		r.log.Warn("object defined more than once", "kind", kind, "object", key, "reason", err.Error())
	}
}

// record stands p for id (in Problems when standing) and reports whether
// its message differs from the last one logged for id.
func (r *reporter) record(id string, p Problem, standing bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.touched != nil {
		r.touched[id] = true
	}
	if standing {
		r.current[id] = p
	} else {
		delete(r.current, id)
	}
	seen := r.last[id] == p.Reason
	r.last[id] = p.Reason
	return !seen
}

// clear forgets the object's problem: the object is fine now, and a
// problem it has again is logged again.
func (r *reporter) clear(kind, key string) {
	r.mu.Lock()
	delete(r.last, kind+"/"+key)
	delete(r.current, kind+"/"+key)
	r.mu.Unlock()
}

// begin starts a manifest load: end then forgets every problem the load
// did not report again (its file or document is gone or fixed).
func (r *reporter) begin() {
	r.mu.Lock()
	r.touched = map[string]bool{}
	r.mu.Unlock()
}

func (r *reporter) end() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range r.last {
		if !r.touched[id] {
			delete(r.last, id)
			delete(r.current, id)
		}
	}
	r.touched = nil
}

// problems returns the problems standing now, by kind and object.
func (r *reporter) problems() []Problem {
	r.mu.Lock()
	out := slices.Collect(maps.Values(r.current))
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b Problem) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Object, b.Object), cmp.Compare(a.Reason, b.Reason))
	})
	return out
}
