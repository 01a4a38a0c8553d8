package agent

import (
	"log/slog"
	"strings"
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
	taken map[string]string
	// shown is every refusal of the last sync, to log only the new ones.
	shown map[string]bool
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
	refused := plan.Sanitize(olderFirst(snap))
	taken := make(map[string]string, len(refused))
	for _, r := range refused {
		taken[r.Service] += r.Frontend + "\x00" + r.Reason + "\n"
	}
	if plan.Changed == nil {
		plan.Changed = map[string]bool{}
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
	ports := map[string]bool{}
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
// lower namespace/name, then the port name. The lookup table is built on
// the first conflict only.
func olderFirst(snap *state.Snapshot) func(a, b string) bool {
	var created map[string]time.Time
	return func(a, b string) bool {
		if created == nil {
			created = make(map[string]time.Time, len(snap.Ports))
			for name, p := range snap.Ports {
				created[name.String()] = serviceCreated(p.Service)
			}
		}
		ta, tb := created[a], created[b]
		if !ta.Equal(tb) {
			return ta.Before(tb)
		}
		na, _, _ := strings.Cut(a, ":")
		nb, _, _ := strings.Cut(b, ":")
		if na != nb {
			return na < nb
		}
		return a < b
	}
}

func serviceCreated(s *model.Service) time.Time {
	if s == nil {
		return time.Time{}
	}
	return s.Created
}
