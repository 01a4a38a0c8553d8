package agent

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/agent/state"
	"github.com/edgeproxy/edgeproxy/datapath"
)

// quarantine keeps what no single service port may do: stop the others.
// Every sync, what the datapath must not be given (a frontend two Services
// claim, a frontend that breaks the plan's invariants) is taken out of the
// plan before Apply, and service ports the backend itself refuses come back
// as datapath.PortErrors; both are reported in /debug/status, explain and
// metrics, and logged once when they appear and when they clear, while the
// rest of the plan is programmed as usual.
type quarantine struct {
	log       *slog.Logger
	conflicts prometheus.Gauge
	refused   prometheus.Gauge
	// taken is what Sanitize took out in the last sync, by service port:
	// a change there must reach the backend as a change of that port.
	taken map[model.ServicePortName]string
	// shown is every refusal of the last sync, to log only the new ones.
	shown map[string]bool
	// sanitizer keeps what each service port of the planner's plans
	// claims: a sync looks at the ports it changed, not at every one.
	sanitizer datapath.Sanitizer
}

func newQuarantine(reg prometheus.Registerer, log *slog.Logger) *quarantine {
	q := &quarantine{
		log: log,
		conflicts: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeproxy_frontend_conflicts",
			Help: "Frontends (address, port, protocol) claimed by more than one Service in the last sync; the older Service keeps each one and the others' are left out.",
		}),
		refused: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeproxy_refused_service_ports",
			Help: "Service ports left out of the datapath, whole or in part, in the last sync (conflicts, invalid frontends, rules the kernel refused).",
		}),
	}
	reg.MustRegister(q.conflicts, q.refused)
	return q
}

// sanitize takes out of plan what the datapath must not be given and marks
// the service ports whose refusals changed since the last sync as changed,
// so that a partial sync adds or removes their frontends.
func (q *quarantine) sanitize(plan *datapath.Plan, snap *state.Snapshot) []datapath.Refusal {
	refused := q.sanitizer.Sanitize(plan, olderFirst(snap))
	taken := make(map[model.ServicePortName]string, len(refused))
	for _, r := range refused {
		taken[r.Service] += r.Frontend + "\x00" + r.Reason + "\n"
	}
	if plan.Changed == nil {
		plan.Changed = map[model.ServicePortName]bool{}
	}
	for s, v := range taken {
		if q.taken[s] != v {
			plan.Changed[s] = true
		}
	}
	for s := range q.taken {
		if _, ok := taken[s]; !ok {
			plan.Changed[s] = true
		}
	}
	q.taken = taken
	return refused
}

// report logs the refusals that are new since the last sync and those that
// cleared, and sets the metrics.
func (q *quarantine) report(refused []datapath.Refusal) {
	shown := make(map[string]bool, len(refused))
	conflicts := 0
	ports := map[model.ServicePortName]bool{}
	for _, r := range refused {
		k := r.String()
		shown[k] = true
		ports[r.Service] = true
		if r.Conflict {
			conflicts++
		}
		if !q.shown[k] {
			q.log.Warn("service port left out of the datapath; the rest is programmed",
				"service", r.Service, "frontend", r.Frontend, "reason", r.Reason)
		}
	}
	for k := range q.shown {
		if !shown[k] {
			q.log.Info("no longer left out of the datapath", "was", k)
		}
	}
	q.shown = shown
	q.conflicts.Set(float64(conflicts))
	q.refused.Set(float64(len(ports)))
}

// olderFirst orders service ports for conflicts as the API server's own
// allocators would: the older Service (creationTimestamp) wins, then the
// lower namespace/name, then the port name.
func olderFirst(snap *state.Snapshot) func(a, b model.ServicePortName) bool {
	return func(a, b model.ServicePortName) bool {
		ta, tb := created(snap, a), created(snap, b)
		if !ta.Equal(tb) {
			return ta.Before(tb)
		}
		sa := model.ServicePortName{Namespace: a.Namespace, Name: a.Name}
		sb := model.ServicePortName{Namespace: b.Namespace, Name: b.Name}
		if c := sa.Compare(sb); c != 0 {
			return c < 0
		}
		return a.Compare(b) < 0
	}
}

// created is the creation time of the Service of port n in snap, zero
// when it has none or is not there.
func created(snap *state.Snapshot, n model.ServicePortName) time.Time {
	if p := snap.Ports[n]; p != nil && p.Service != nil {
		return p.Service.Created
	}
	return time.Time{}
}
