// Package source turns API objects — from a kube-apiserver watch or from a
// directory of manifests — into model values handed to a Sink. It is the
// only package that imports client-go informers. Objects the proxy cannot use
// are skipped, logged once and counted; nothing here stops on a bad object.
package source

import (
	"errors"
	"log/slog"
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

// reporter logs a problem with an object once (again only when the problem
// changes) and counts every occurrence.
type reporter struct {
	log     *slog.Logger
	metrics *Metrics
	mu      sync.Mutex
	last    map[string]string // kind/key → last message logged
}

func newReporter(log *slog.Logger, m *Metrics) *reporter {
	if m == nil {
		m = NewMetrics(nil)
	}
	return &reporter{log: log, metrics: m, last: make(map[string]string)}
}

// problem records err for the object; ignored objects (ErrSkip) are logged
// at debug, bad ones at warn.
func (r *reporter) problem(kind, key string, err error) {
	reason, level := "bad", slog.LevelWarn
	if errors.Is(err, ErrSkip) {
		reason, level = "ignored", slog.LevelDebug
	}
	r.metrics.Skipped.WithLabelValues(kind, reason).Inc()
	if msg := err.Error(); r.firstTime(kind+"/"+key, msg) {
		r.log.Log(nil, level, "skipping object", "kind", kind, "object", key, "reason", msg)
	}
}

// warnings records problems with parts of an object that was still used.
func (r *reporter) warnings(kind, key string, ws []string) {
	if len(ws) == 0 {
		r.clear(kind, key)
		return
	}
	r.metrics.Skipped.WithLabelValues(kind+"-part", "bad").Add(float64(len(ws)))
	if msg := joinWarnings(ws); r.firstTime(kind+"/"+key, msg) {
		r.log.Warn("skipping parts of object", "kind", kind, "object", key, "reasons", msg)
	}
}

// duplicate records an object defined more than once in the manifests (in
// two files or twice in one): counted every time, logged once.
func (r *reporter) duplicate(kind, key string, err error) {
	r.metrics.Skipped.WithLabelValues(kind, "duplicate").Inc()
	if msg := err.Error(); r.firstTime("duplicate "+kind+"/"+key, msg) {
		r.log.Warn("object defined more than once", "kind", kind, "object", key, "reason", msg)
	}
}

// firstTime records msg for id and reports whether it differs from the
// last one recorded.
func (r *reporter) firstTime(id, msg string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := r.last[id] == msg
	r.last[id] = msg
	return !seen
}

func (r *reporter) clear(kind, key string) {
	r.mu.Lock()
	delete(r.last, kind+"/"+key)
	r.mu.Unlock()
}

func joinWarnings(ws []string) string {
	s := ws[0]
	for _, w := range ws[1:] {
		s += "; " + w
	}
	return s
}
