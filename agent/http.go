package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/agent/planner"
	"github.com/edgeproxy/edgeproxy/agent/policychain"
	"github.com/edgeproxy/edgeproxy/agent/source"
	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/nftables"
)

type server struct {
	name  string
	ln    net.Listener
	serve func(ctx context.Context) error
}

// listen opens the configured listeners now, so that a taken address fails
// Run at once instead of later in a goroutine.
func (a *Agent) listen() ([]server, error) {
	cfg := a.Config().Server
	var out []server
	add := func(name, addr string, mux *http.ServeMux) error {
		if addr == "" {
			return nil
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("agent: %s server: %w", name, err)
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		out = append(out, server{name: name, ln: ln, serve: func(ctx context.Context) error {
			go func() {
				<-ctx.Done()
				sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				_ = srv.Shutdown(sctx)
			}()
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		}})
		return nil
	}
	health := http.NewServeMux()
	health.HandleFunc("/healthz", a.serveHealthz)
	health.HandleFunc("/livez", a.serveLivez)
	metrics := http.NewServeMux()
	metrics.Handle("/metrics", promhttp.HandlerFor(a.opts.Registry, promhttp.HandlerOpts{}))
	metrics.HandleFunc("/debug/plan", a.servePlan)
	metrics.HandleFunc("/debug/status", a.serveStatus)
	metrics.HandleFunc("/debug/explain", a.serveExplain)
	metrics.HandleFunc("/debug/shadow", a.serveShadow)
	if cfg.Healthz == cfg.Metrics && cfg.Healthz != "" {
		health.Handle("/", metrics)
		return out, add("healthz+metrics", cfg.Healthz, health)
	}
	if err := add("healthz", cfg.Healthz, health); err != nil {
		return nil, err
	}
	if err := add("metrics", cfg.Metrics, metrics); err != nil {
		for _, s := range out {
			s.ln.Close()
		}
		return nil, err
	}
	return out, nil
}

// Health is the /healthz answer.
type Health struct {
	Healthy      bool      `json:"healthy"`
	LastUpdated  time.Time `json:"lastUpdated"`
	CurrentTime  time.Time `json:"currentTime"`
	NodeEligible bool      `json:"nodeEligible"`
	// PendingSince is when the oldest change not yet programmed arrived.
	PendingSince time.Time `json:"pendingSince,omitzero"`
	LastError    string    `json:"lastError,omitempty"`
	// APIServerLastContact is zero with a manifest source.
	APIServerLastContact time.Time `json:"apiserverLastContact,omitzero"`
}

// HealthNow computes health with kube-proxy's meaning: unhealthy when a
// change has been waiting for longer than the health timeout, or when the
// first programming has not happened within it, or (with an API source)
// before both the first programming and the API server's first answer.
// An unreachable API server alone does not make a proxy that has
// programmed the kernel unhealthy: its rules are still in force.
// NodeEligible is false while the Node is being deleted or tainted
// ToBeDeletedByClusterAutoscaler; only /healthz counts it, not Healthy.
func (a *Agent) HealthNow(now time.Time) Health {
	st := a.runner.Status()
	if st.LastSuccess.IsZero() {
		// The first sync has programmed the kernel (Synced is closed, systemd
		// told ready) but has not returned to the runner yet: it counts as
		// done, and the requests it took over as met.
		if ns := a.firstSynced.Load(); ns != 0 {
			st.LastSuccess, st.PendingSince = time.Unix(0, ns), time.Time{}
		}
	}
	h := Health{LastUpdated: st.LastSuccess, CurrentTime: now, NodeEligible: !a.nodeIneligible.Load(), PendingSince: st.PendingSince}
	if st.LastError != nil {
		h.LastError = st.LastError.Error()
	}
	if a.api != nil {
		h.APIServerLastContact = a.api.LastContact()
	}
	pending := st.PendingSince
	if st.LastSuccess.IsZero() && (pending.IsZero() || a.startTime.Before(pending)) {
		pending = a.startTime
	}
	h.Healthy = pending.IsZero() || now.Sub(pending) < a.Config().Sync.HealthTimeout
	if st.LastSuccess.IsZero() && a.api != nil && h.APIServerLastContact.IsZero() {
		// kube-proxy serves no health at all until it has read its Node
		// from the API server: a health checker sees a closed port. With
		// nothing programmed and no answer from the API server yet, we
		// are as unhealthy (test/conformance/DIFFERENCES.md, "Health").
		h.Healthy = false
	}
	return h
}

// serveHealthz answers load balancers: 503 while the proxy is unhealthy
// or its Node is on the way out (kube-proxy's /healthz).
func (a *Agent) serveHealthz(w http.ResponseWriter, _ *http.Request) {
	h := a.HealthNow(time.Now())
	a.serveHealth(w, h, h.Healthy && h.NodeEligible, a.metrics.healthz)
}

// serveLivez answers liveness probes: the node does not count.
func (a *Agent) serveLivez(w http.ResponseWriter, _ *http.Request) {
	h := a.HealthNow(time.Now())
	a.serveHealth(w, h, h.Healthy, a.metrics.livez)
}

func (a *Agent) serveHealth(w http.ResponseWriter, h Health, ok bool, count *prometheus.CounterVec) {
	code := http.StatusOK
	if !ok {
		code = http.StatusServiceUnavailable
	}
	count.WithLabelValues(strconv.Itoa(code)).Inc()
	writeJSON(w, code, h)
}

// PlanView is the /debug/plan answer.
type PlanView struct {
	Mode       string                                      `json:"mode"`
	Generation uint64                                      `json:"generation"`
	Frontends  []datapath.Frontend                         `json:"frontends"`
	Explain    map[model.ServicePortName][]planner.Explain `json:"explain"`
	Text       string                                      `json:"text"`
}

func (a *Agent) planView() (PlanView, bool) {
	res := a.Last()
	if res == nil {
		return PlanView{}, false
	}
	return PlanView{
		Mode: a.backend.Name(), Generation: res.Plan.Generation, Frontends: res.Plan.Frontends,
		Explain: res.Explains(nil), Text: res.Plan.String(),
	}, true
}

func (a *Agent) servePlan(w http.ResponseWriter, _ *http.Request) {
	v, ok := a.planView()
	if !ok {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "no plan yet: the first sync has not finished"})
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// Status is the /debug/status answer, read by `edgeproxy status`.
type Status struct {
	Version    string        `json:"version"`
	Mode       string        `json:"mode"`
	Node       string        `json:"node"`
	Source     string        `json:"source"`
	Started    time.Time     `json:"started"`
	Health     Health        `json:"health"`
	Generation uint64        `json:"generation"`
	Services   []ServiceView `json:"services"`
	// SnapshotWritten is when the last known state on disk was written (or
	// loaded at an offline start); zero when there is none.
	SnapshotWritten time.Time `json:"snapshotWritten,omitzero"`
	// FromSnapshot: the agent started without the API server and serves
	// the snapshot until the API server has been listed.
	FromSnapshot bool `json:"fromSnapshot,omitempty"`
	// APIReachable is false when the API server did not answer the last
	// heartbeat.
	APIReachable bool `json:"apiReachable"`
	// Link is what the connections to the API server moved and asked for
	// since the start; nil with a manifest source.
	Link *source.LinkUsage `json:"link,omitempty"`
	// Modules is the health of each loaded policy module.
	Modules []policychain.ModuleStatus `json:"modules,omitempty"`
	// ExternalIPsIgnored names the Services whose externalIPs are not
	// programmed because externalIPs is off.
	ExternalIPsIgnored []string `json:"externalIPsIgnored,omitempty"`
	// Refused lists what the last sync left out of the datapath and why
	// (frontend conflicts, invalid frontends, rules the kernel refused);
	// everything else was programmed.
	Refused []datapath.Refusal `json:"refused,omitempty"`
	// Probes is endpoint probing while the API server is away; nil with
	// health.mode: off.
	Probes *ProbeStatus `json:"probes,omitempty"`
	// Skipped lists the inputs standing skipped, whole or in part (Partly:
	// the object is used without the named parts, e.g. a bad
	// edgeproxy.io/offline-probe), as they were logged; not the objects
	// that are not for this proxy (headless, other proxies').
	Skipped []source.Problem `json:"skipped,omitempty"`
	// KubeProxy is what the agent found and removed of kube-proxy's
	// kernel objects after its first sync; nil before that look.
	KubeProxy *KubeProxyStatus `json:"kubeProxy,omitempty"`
	// NFTables is the nftables datapath's last apply and tables (mode
	// nftables only).
	NFTables *nftables.Status `json:"nftables,omitempty"`
	// Config is the configuration in force (after reloads).
	Config *config.Config `json:"config"`
}

// ServiceView is one service port's frontends and weighted endpoints.
type ServiceView struct {
	Service   model.ServicePortName `json:"service"`
	Frontends []datapath.Frontend   `json:"frontends"`
}

func (a *Agent) serveStatus(w http.ResponseWriter, _ *http.Request) {
	cfg := a.Config()
	st := Status{
		Version: a.opts.Version, Mode: a.backend.Name(), Node: cfg.NodeName, Started: a.startTime,
		Health: a.HealthNow(time.Now()), Source: "api", Config: cfg,
	}
	if cfg.Manifests != "" {
		st.Source = "manifests " + cfg.Manifests
	}
	if a.chains != nil {
		st.Modules = a.chains.Modules()
	}
	if n := a.snapAge.Load(); n != 0 {
		st.SnapshotWritten = time.Unix(0, n)
	}
	st.FromSnapshot = a.fromSnapshot.Load()
	st.APIReachable = a.api == nil || a.api.Reachable()
	if a.link != nil {
		u := a.link.Usage()
		st.Link = &u
	}
	st.Refused = a.Refused()
	st.Probes = a.probeStatus()
	st.Skipped = a.sourceProblems()
	st.KubeProxy = a.kubeProxy.Status()
	if p, ok := a.backend.(*nftables.Proxier); ok {
		ns := p.Status()
		st.NFTables = &ns
	}
	if res := a.Last(); res != nil {
		st.Generation = res.Plan.Generation
		st.ExternalIPsIgnored = res.ExternalIPsIgnored
		byService := map[model.ServicePortName]*ServiceView{}
		for _, f := range res.Plan.Frontends {
			v := byService[f.Service]
			if v == nil {
				v = &ServiceView{Service: f.Service}
				byService[f.Service] = v
			}
			v.Frontends = append(v.Frontends, f)
		}
		for _, v := range byService {
			st.Services = append(st.Services, *v)
		}
		slices.SortFunc(st.Services, func(a, b ServiceView) int { return a.Service.Compare(b.Service) })
	}
	writeJSON(w, http.StatusOK, st)
}

func (a *Agent) serveExplain(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("service")
	if strings.Count(name, "/") != 1 {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "service=NAMESPACE/NAME is required"})
		return
	}
	res := a.Last()
	if res == nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "no plan yet: the first sync has not finished"})
		return
	}
	out := res.Explains(func(port model.ServicePortName) bool { return port.Namespace+"/"+port.Name == name })
	for port, ex := range out {
		notes := append(refusalNotes(port, a.Refused()), a.probeNotes(port)...)
		out[port] = withNotes(ex, append(notes, problemNotes(port, a.sourceProblems())...))
	}
	if len(out) == 0 {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf("service %s is not in the plan (unknown, not proxied, or without ports)", name)})
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// serveShadow answers /debug/shadow[?service=NAMESPACE/NAME]: the shadow
// policy modules, their counts and their latest differences from the
// modules they shadow.
func (a *Agent) serveShadow(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("service")
	if name != "" && strings.Count(name, "/") != 1 {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "service must be NAMESPACE/NAME"})
		return
	}
	if a.chains == nil {
		writeJSON(w, http.StatusOK, policychain.ShadowReport{Modules: []policychain.ShadowStatus{}, Diffs: []policychain.ShadowDiff{}})
		return
	}
	writeJSON(w, http.StatusOK, a.chains.ShadowReport(name))
}

// sourceProblems returns the source's standing problems.
func (a *Agent) sourceProblems() []source.Problem {
	if p, ok := a.source.(interface{ Problems() []source.Problem }); ok {
		return p.Problems()
	}
	return nil
}

// problemNotes returns a note for each standing problem of port's Service
// (the parts of it the source left out, a second definition).
func problemNotes(port model.ServicePortName, problems []source.Problem) []string {
	var notes []string
	for _, p := range problems {
		if p.Kind == "Service" && p.Object == port.Namespace+"/"+port.Name {
			notes = append(notes, "source: "+p.Reason)
		}
	}
	return notes
}

// refusalNotes returns a note for each refusal of port.
func refusalNotes(port model.ServicePortName, refused []datapath.Refusal) []string {
	var notes []string
	for _, r := range refused {
		if r.Service == port {
			what := "left out of the datapath"
			if r.Frontend != "" {
				what = r.Frontend + " left out of the datapath"
			}
			notes = append(notes, what+": "+r.Reason)
		}
	}
	return notes
}

// withNotes returns ex with notes added, without writing into the notes
// slices ex shares with the selection.
func withNotes(ex []planner.Explain, notes []string) []planner.Explain {
	if len(notes) == 0 {
		return ex
	}
	out := make([]planner.Explain, len(ex))
	for i, e := range ex {
		e.Notes = append(slices.Clip(e.Notes), notes...)
		out[i] = e
	}
	return out
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
