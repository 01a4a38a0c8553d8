// Package planner turns a state snapshot into a datapath.Plan: for every
// service port and IP family it runs the built-in selection, lets the policy
// weigh the chosen endpoints, and lays out the frontends (ClusterIPs,
// NodePorts, ExternalIPs, LoadBalancer IPs) with their weighted endpoints.
//
// It is pure apart from the policy call and keeps per-port results between
// calls, so a sync after a one-service change recomputes one service port.
// How a port was planned (Explain) is not kept: a Result computes it when
// asked, from its snapshot and the policy's verdicts.
package planner

import (
	"context"
	"maps"
	"net/netip"
	"reflect"
	"slices"

	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/agent/selection"
	"github.com/edgeproxy/edgeproxy/agent/state"
	"github.com/edgeproxy/edgeproxy/datapath"
)

// Weighing is a policy's verdict for one service port and family: a weight
// per endpoint given (0 drops it) and optionally an IPVS scheduler.
type Weighing struct {
	Weights        []uint32
	Scheduler      string
	SchedulerFlags []string
	// Explain is shown as-is in /debug/plan and `edgeproxy explain`. It
	// is kept as long as the port's plan is: keep it small.
	Explain any
	// Retry asks for the port to be weighed again at the next Build even
	// if nothing changed, e.g. because a module failed and its chain's
	// failure policy stood in for it.
	Retry bool
}

// Request is one service port and family to weigh: the endpoints that
// built-in selection chose for it (internal and external together).
type Request struct {
	Service   *model.Service
	Port      model.ServicePort
	Node      *model.Node
	Endpoints []model.PortEndpoint
}

// Policy weighs the endpoints that built-in selection chose. A Build hands
// it the service ports and families it recomputes many at a time (up to
// 256 per call, from a goroutine of its own), so that a policy can evaluate
// them in batches; it returns one Weighing per request, in order, each
// with exactly one weight per endpoint. A nil Policy weighs every endpoint
// 1.
type Policy interface {
	Weigh(ctx context.Context, reqs []Request) []Weighing
}

// Options are the settings that shape frontends.
type Options struct {
	// ExternalIPs: program spec.externalIPs (off by default upstream-style).
	ExternalIPs bool
}

// Explain records how one service port in one family was planned.
type Explain struct {
	Service   model.ServicePortName `json:"service"`
	Family    datapath.Family       `json:"family"`
	Topology  string                `json:"topology,omitempty"`
	Internal  []Decision            `json:"internal"`
	External  []Decision            `json:"external,omitempty"`
	Skipped   []Decision            `json:"skipped,omitempty"`
	Notes     []string              `json:"notes,omitempty"`
	Policy    any                   `json:"policy,omitempty"`
	Frontends []string              `json:"frontends"`
	Weights   map[string]uint32     `json:"weights"`
}

// Decision is one endpoint's built-in verdict.
type Decision struct {
	Endpoint string `json:"endpoint"`
	// Traffic is set on skipped endpoints: which traffic skipped it
	// (internal, external, or both).
	Traffic string `json:"traffic,omitempty"`
	Node    string `json:"node,omitempty"`
	Zone    string `json:"zone,omitempty"`
	Local   bool   `json:"local,omitempty"`
	Reason  string `json:"reason"`
}

// HealthCheck is what a healthCheckNodePort reports for one Service.
type HealthCheck struct {
	Namespace, Name string // the Service's
	LocalEndpoints  int
}

// Result is a plan with what goes beside it. It is immutable and may be
// read while the planner builds the next one.
type Result struct {
	Plan         *datapath.Plan
	HealthChecks map[uint16]HealthCheck
	// Evaluated counts the service ports computed in this call (the rest
	// were reused from the previous one).
	Evaluated int
	// ExternalIPsIgnored names the Services ("namespace/name", sorted)
	// whose spec.externalIPs are not programmed because Options.ExternalIPs
	// is off.
	ExternalIPsIgnored []string

	// What Explain computes from: the snapshot planned and each port's
	// plan (shared with the planner, which replaces but never changes
	// them).
	node  *model.Node
	ports map[model.ServicePortName]*state.Port
	plans []*portPlan // sorted by name
}

type portPlan struct {
	name model.ServicePortName
	svc  *model.Service
	// retry: weigh again next time, the policy fell back.
	retry bool
	// frontends are in the order the port lays them out (explanations
	// show them so); sorted holds them in the plan's order
	// (datapath.Compare) when that order differs, nil when it does not.
	// The plan is the ports' sorted frontends in the order of their names.
	frontends, sorted []datapath.Frontend
	// weighed is the policy's verdict for each family planned, in
	// selectPort's order: what an explanation cannot compute again; nil
	// when every family's was equal weights (isEqualWeighing).
	weighed []Weighing
	// The port's endpoints of each family, all of them: the
	// healthCheckNodePort count keeps the ready ones on this node.
	epsV4 []model.PortEndpoint
	epsV6 []model.PortEndpoint
}

// Planner keeps per-port results between calls. Not safe for concurrent use.
type Planner struct {
	opts   Options
	policy Policy
	ports  map[model.ServicePortName]*portPlan
	// order holds the values of ports sorted by name, so that a Build
	// lays out the plan in its canonical order without sorting every
	// frontend again: it is updated in place for the ports a Build
	// recomputes, and sorted again only when ports come or go.
	order []*portPlan
	gen   uint64
	// built is the generation of the snapshot the last Build planned
	// whole (inStep: ports then held every port of it, each as planned
	// for it). A Build of the next generation then needs to look only
	// at its Changed ports and at retries, not at every port.
	built   uint64
	inStep  bool
	retries map[model.ServicePortName]bool
	// unsettled: the cache was invalidated, or some port asked to be
	// weighed again, since the last Build.
	unsettled bool
}

// New returns a planner; policy may be nil.
func New(opts Options, policy Policy) *Planner {
	return &Planner{opts: opts, policy: policy, ports: make(map[model.ServicePortName]*portPlan), retries: make(map[model.ServicePortName]bool)}
}

// SetOptions changes the options and forgets cached results when they differ.
func (p *Planner) SetOptions(opts Options) {
	if opts != p.opts {
		p.opts = opts
		p.Invalidate()
	}
}

// Invalidate forgets every cached port, e.g. after the policy changed, so
// the next Build recomputes all of them.
func (p *Planner) Invalidate() {
	clear(p.ports)
	clear(p.retries)
	p.order, p.inStep, p.unsettled = nil, false, true
}

// Settled reports whether a Build of an unchanged snapshot would compute
// nothing: no invalidation and no port waiting to be weighed again since
// the last Build.
func (p *Planner) Settled() bool { return !p.unsettled }

// Build computes the plan for snap. Ports not in snap.Changed are reused
// unless the node changed or the cache was invalidated.
func (p *Planner) Build(ctx context.Context, snap *state.Snapshot) *Result {
	res := &Result{HealthChecks: make(map[uint16]HealthCheck), node: snap.Node, ports: snap.Ports}
	return p.build(ctx, snap, res, make(map[model.ServicePortName]bool))
}

// build is Build, with the ports found changed so far.
func (p *Planner) build(ctx context.Context, snap *state.Snapshot, res *Result, changed map[model.ServicePortName]bool) *Result {
	reorder := false // ports came or went: p.order is sorted again
	// The ports that may need planning: every port, unless this snapshot
	// follows the last one planned (then its Changed ports and retries).
	next := p.inStep && !snap.NodeChanged &&
		(snap.Generation == p.built+1 || snap.Generation == p.built && len(snap.Changed) == 0)
	candidates := func(yield func(model.ServicePortName) bool) {
		for name := range snap.Changed {
			if !yield(name) {
				return
			}
		}
		for name := range p.retries {
			if !snap.Changed[name] && !yield(name) {
				return
			}
		}
	}
	if !next {
		candidates = maps.Keys(snap.Ports)
		for name := range p.ports {
			if _, ok := snap.Ports[name]; !ok {
				changed[name] = true
				p.forget(name)
				reorder = true
			}
		}
	}
	var work []*portWork
	wg := p.startWeigher(ctx)
	for name := range candidates {
		port, ok := snap.Ports[name]
		if !ok { // removed (only a Changed port can be)
			if _, cached := p.ports[name]; cached {
				changed[name] = true
				p.forget(name)
				reorder = true
			}
			continue
		}
		old, cached := p.ports[name]
		if cached && !old.retry && !snap.NodeChanged && !snap.Changed[name] {
			continue
		}
		pw := selectPort(port, snap.Node)
		work = append(work, pw)
		wg.add(pw, snap.Node)
	}
	wg.wait()
	p.unsettled = false
	for _, pw := range work {
		name := pw.port.Name
		old, cached := p.ports[name]
		pp := p.planPort(pw)
		if !cached || !reflect.DeepEqual(old.frontends, pp.frontends) {
			changed[name] = true
		}
		p.ports[name] = pp
		if pp.retry {
			p.retries[name] = true
		} else {
			delete(p.retries, name)
		}
		if cached && !reorder {
			p.order[p.index(name)] = pp
		} else {
			reorder = true
		}
		p.unsettled = p.unsettled || pp.retry
		res.Evaluated++
	}
	if len(p.ports) != len(snap.Ports) {
		// Not the snapshot that follows the last one planned after all
		// (a port came without being marked changed): plan it whole.
		// The ports planned so far stay changed.
		p.inStep, p.order = false, nil
		return p.build(ctx, snap, res, changed)
	}
	p.built, p.inStep = snap.Generation, true
	if reorder || len(p.order) != len(p.ports) {
		p.order = slices.SortedFunc(maps.Values(p.ports), func(a, b *portPlan) int { return a.name.Compare(b.name) })
	}

	p.gen++
	plan := &datapath.Plan{Generation: p.gen, Changed: changed}
	// Local endpoints per service and family: each family is counted on
	// its own and the larger count is the answer, as kube-proxy's
	// dual-stack proxiers each report their family's count to one health
	// server (a dual-stack pod is one endpoint, not two).
	local := make(map[HealthCheck][2][][]model.PortEndpoint) // by Namespace and Name only
	n := 0
	for _, pp := range p.order {
		n += len(pp.frontends)
	}
	// The ports in name order, each port's frontends in the plan's order:
	// the plan's canonical order (datapath.Plan.Sort) without a sort.
	plan.Frontends = make([]datapath.Frontend, 0, n)
	for _, pp := range p.order {
		if pp.sorted != nil {
			plan.Frontends = append(plan.Frontends, pp.sorted...)
		} else {
			plan.Frontends = append(plan.Frontends, pp.frontends...)
		}
		svc := pp.svc
		if !p.opts.ExternalIPs && len(svc.ExternalIPs) > 0 {
			res.ExternalIPsIgnored = append(res.ExternalIPsIgnored, svc.Namespace+"/"+svc.Name)
		}
		if svc.ExternalLocal && svc.HealthCheckNodePort != 0 {
			key := HealthCheck{Namespace: svc.Namespace, Name: svc.Name}
			l := local[key]
			l[0], l[1] = append(l[0], pp.epsV4), append(l[1], pp.epsV6)
			local[key] = l
			res.HealthChecks[svc.HealthCheckNodePort] = key
		}
	}
	nodeName := ""
	if snap.Node != nil {
		nodeName = snap.Node.Name
	}
	for port, hc := range res.HealthChecks {
		l := local[HealthCheck{Namespace: hc.Namespace, Name: hc.Name}]
		hc.LocalEndpoints = max(selection.CountLocalReady(nodeName, l[0]...), selection.CountLocalReady(nodeName, l[1]...))
		res.HealthChecks[port] = hc
	}
	if snap.Node != nil {
		plan.NodeIPs = primaryIPs(snap.Node.Addresses)
		plan.PodCIDRs = snap.Node.PodCIDRs
	}
	plan.HealthCheckPorts = slices.Sorted(maps.Keys(res.HealthChecks))
	slices.Sort(res.ExternalIPsIgnored)
	res.ExternalIPsIgnored = slices.Compact(res.ExternalIPsIgnored)
	res.Plan = plan
	// The next Build replaces entries of p.order in place.
	res.plans = slices.Clone(p.order)
	return res
}

// forget drops the port named name.
func (p *Planner) forget(name model.ServicePortName) {
	delete(p.ports, name)
	delete(p.retries, name)
}

// index returns where the port named name is in p.order.
func (p *Planner) index(name model.ServicePortName) int {
	i, _ := slices.BinarySearchFunc(p.order, name, func(pp *portPlan, n model.ServicePortName) int { return pp.name.Compare(n) })
	return i
}

// plan returns the plan of the port named name, or nil.
func (r *Result) plan(name model.ServicePortName) *portPlan {
	i, ok := slices.BinarySearchFunc(r.plans, name, func(pp *portPlan, n model.ServicePortName) int { return pp.name.Compare(n) })
	if !ok {
		return nil
	}
	return r.plans[i]
}

// Explain returns how port name was planned, one Explain per IP family it
// serves; nil when the port is not in the plan. It runs the built-in
// selection again over the snapshot that was planned (selection is pure)
// and takes the policy's verdicts and the frontends from the port's plan,
// so it shows what the Build that planned the port saw.
func (r *Result) Explain(name model.ServicePortName) []Explain {
	pp, port := r.plan(name), r.ports[name]
	if pp == nil || port == nil {
		return nil
	}
	pw := selectPort(port, r.node)
	var out []Explain
	for i := range pw.fams {
		fw := &pw.fams[i]
		if i < len(pp.weighed) {
			fw.w = pp.weighed[i]
		}
		fam := datapath.Family(fw.fam)
		fs := slices.DeleteFunc(slices.Clone(pp.frontends), func(f datapath.Frontend) bool { return f.Family != fam })
		out = append(out, explain(name, fw, weightsOf(fw), fs))
	}
	return out
}

// Explains returns the explanations of the planned ports that keep
// accepts, or of all of them when keep is nil.
func (r *Result) Explains(keep func(model.ServicePortName) bool) map[model.ServicePortName][]Explain {
	out := make(map[model.ServicePortName][]Explain)
	for _, pp := range r.plans {
		if keep == nil || keep(pp.name) {
			out[pp.name] = r.Explain(pp.name)
		}
	}
	return out
}

// portWork is a service port being recomputed: built-in selection done
// per family, policy weighing pending.
type portWork struct {
	port *state.Port
	fams []famWork
}

type famWork struct {
	fam    model.Family
	nodeIP netip.Addr // the node's primary address of fam, if any
	vips   []netip.Addr
	eps    []model.PortEndpoint
	sel    selection.Result
	union  []model.PortEndpoint
	w      Weighing
}

// selectPort runs built-in selection for each family the service serves.
func selectPort(port *state.Port, node *model.Node) *portWork {
	pw := &portWork{port: port}
	for _, fam := range []model.Family{model.IPv4, model.IPv6} {
		vips := ofFamily(port.Service.ClusterIPs, fam)
		if len(vips) == 0 {
			// A Service serves only the families it has ClusterIPs for.
			continue
		}
		eps := port.Endpoints(fam)
		sel := selection.Select(port.Service, port.Port, eps, node)
		union := unionOf(sel.Internal, sel.External)
		if port.Service.ExternalLocal {
			// The short-circuit set is weighed with the rest.
			union = unionOf(sel.Internal, sel.External, sel.Cluster)
		}
		fw := famWork{fam: fam, vips: vips, eps: eps, sel: sel, union: union, w: Weighing{Weights: model.EqualWeights(len(union))}}
		if node != nil {
			if ips := ofFamily(primaryIPs(node.Addresses), fam); len(ips) > 0 {
				fw.nodeIP = ips[0]
			}
		}
		pw.fams = append(pw.fams, fw)
	}
	return pw
}

// weighChunk is how many requests the planner hands the policy at once.
const weighChunk = 256

// weigher hands the policy the ports Build recomputes, weighChunk requests
// per call, on a goroutine of its own while Build goes on with built-in
// selection: on a node with more than one CPU the policy's cost (Wasm
// calls) then overlaps the selection's instead of adding to it. Build owns
// it and waits for it; the policy bounds each call (module deadlines), so
// the wait is bounded too.
type weigher struct {
	reqs  []Request
	dst   []*Weighing
	ch    chan weighBatch
	done  chan struct{}
	panic any // re-raised on Build's goroutine
}

type weighBatch struct {
	reqs []Request
	dst  []*Weighing
}

// startWeigher returns nil when there is no policy (every weight stays 1).
func (p *Planner) startWeigher(ctx context.Context) *weigher {
	if p.policy == nil {
		return nil
	}
	w := &weigher{ch: make(chan weighBatch, 4), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer func() {
			if r := recover(); r != nil {
				w.panic = r
				for range w.ch { // let Build finish sending
				}
			}
		}()
		for b := range w.ch {
			for i, res := range p.policy.Weigh(ctx, b.reqs) {
				if i < len(b.dst) {
					*b.dst[i] = res
				}
			}
		}
	}()
	return w
}

// add queues every family of pw that has endpoints.
func (w *weigher) add(pw *portWork, node *model.Node) {
	if w == nil {
		return
	}
	for i := range pw.fams {
		f := &pw.fams[i]
		if len(f.union) > 0 {
			w.reqs = append(w.reqs, Request{Service: pw.port.Service, Port: pw.port.Port, Node: node, Endpoints: f.union})
			w.dst = append(w.dst, &f.w)
		}
	}
	if len(w.reqs) >= weighChunk {
		w.ch <- weighBatch{w.reqs, w.dst}
		w.reqs, w.dst = nil, nil
	}
}

// wait hands over what is queued and returns when every request is
// weighed.
func (w *weigher) wait() {
	if w == nil {
		return
	}
	if len(w.reqs) > 0 {
		w.ch <- weighBatch{w.reqs, w.dst}
	}
	close(w.ch)
	<-w.done
	if w.panic != nil {
		panic(w.panic)
	}
}

func (p *Planner) planPort(pw *portWork) *portPlan {
	pp := &portPlan{name: pw.port.Name, svc: pw.port.Service}
	builtin := true
	for i := range pw.fams {
		fw := &pw.fams[i]
		pp.retry = pp.retry || fw.w.Retry
		weight := weightsOf(fw)
		fs := p.frontends(pw.port, fw, weight)
		pp.frontends = append(pp.frontends, fs...)
		pp.weighed = append(pp.weighed, fw.w)
		builtin = builtin && isEqualWeighing(fw.w, len(fw.union))
		if fw.fam == model.IPv4 {
			pp.epsV4 = fw.eps
		} else {
			pp.epsV6 = fw.eps
		}
	}
	if builtin {
		// Every weight 1 and nothing else: what selectPort starts an
		// explanation with, not kept (144 bytes a port).
		pp.weighed = nil
	}
	cmp := func(a, b datapath.Frontend) int { return datapath.Compare(&a, &b) }
	if !slices.IsSortedFunc(pp.frontends, cmp) {
		pp.sorted = slices.SortedFunc(slices.Values(pp.frontends), cmp)
	}
	return pp
}

// isEqualWeighing reports whether w weighs n endpoints 1 each and says
// nothing more: the weighing without (or before) a policy.
func isEqualWeighing(w Weighing, n int) bool {
	if w.Scheduler != "" || w.SchedulerFlags != nil || w.Explain != nil || w.Retry || len(w.Weights) != n {
		return false
	}
	for _, x := range w.Weights {
		if x != 1 {
			return false
		}
	}
	return true
}

// weightsOf maps each endpoint the policy weighed to its weight, capped at
// datapath.MaxWeight.
func weightsOf(fw *famWork) map[netip.AddrPort]uint32 {
	weight := make(map[netip.AddrPort]uint32, len(fw.union))
	for i, e := range fw.union {
		if i < len(fw.w.Weights) {
			weight[e.AddrPort()] = min(fw.w.Weights[i], datapath.MaxWeight)
		}
	}
	return weight
}

// frontends lays out the frontends of port in one family: its cluster IPs,
// node port, external IPs and load balancer IPs, each with the endpoints
// its traffic policy allows, weighted.
func (p *Planner) frontends(port *state.Port, fw *famWork, weight map[netip.AddrPort]uint32) []datapath.Frontend {
	svc, sel := port.Service, &fw.sel
	base := datapath.Frontend{
		Service:        port.Name,
		Protocol:       datapath.Protocol(port.Port.Protocol),
		Family:         datapath.Family(fw.fam),
		Affinity:       svc.Affinity,
		Scheduler:      fw.w.Scheduler,
		SchedulerFlags: fw.w.SchedulerFlags,
	}
	if base.Protocol == datapath.UDP {
		base.Serving = serving(fw.eps)
	}
	var out []datapath.Frontend
	internal := endpoints(sel.Internal, weight)
	for _, vip := range fw.vips {
		f := base
		f.Kind, f.Addr, f.Port, f.Endpoints = datapath.ClusterIP, vip, port.Port.Port, internal
		f.Drop = svc.InternalLocal && sel.Usable && len(internal) == 0
		out = append(out, f)
	}
	ext := base
	ext.LocalOnly = svc.ExternalLocal
	ext.Endpoints = endpoints(sel.External, weight)
	ext.Drop = svc.ExternalLocal && sel.Usable && len(ext.Endpoints) == 0
	if svc.ExternalLocal {
		ext.Cluster = endpoints(sel.Cluster, weight)
	}
	if port.Port.NodePort != 0 {
		f := ext
		f.Kind, f.Port = datapath.NodePort, port.Port.NodePort
		out = append(out, f)
	}
	if p.opts.ExternalIPs {
		for _, a := range ofFamily(svc.ExternalIPs, fw.fam) {
			f := ext
			f.Kind, f.Addr, f.Port = datapath.ExternalIP, a, port.Port.Port
			out = append(out, f)
		}
	}
	for _, a := range ofFamily(svc.LoadBalancerIPs, fw.fam) {
		f := ext
		f.Kind, f.Addr, f.Port = datapath.LoadBalancer, a, port.Port.Port
		f.SourceRanges = prefixesOfFamily(svc.SourceRanges, fw.fam)
		f.SourceRangesHoldNode = fw.nodeIP.IsValid() && slices.ContainsFunc(f.SourceRanges, func(r netip.Prefix) bool { return r.Contains(fw.nodeIP) })
		out = append(out, f)
	}
	// Two VIPs of a Service can coincide (e.g. an ExternalIP equal to a
	// LoadBalancer IP); keep the first frontend of each key.
	return dedupe(out)
}

// explain records how port name was planned in one family, with the
// frontends fs laid out for it.
func explain(name model.ServicePortName, fw *famWork, weight map[netip.AddrPort]uint32, fs []datapath.Frontend) Explain {
	sel := &fw.sel
	ex := Explain{
		Service: name, Family: datapath.Family(fw.fam), Topology: sel.Topology, Notes: sel.Notes, Policy: fw.w.Explain,
		Internal: decisions(sel.Internal), External: decisions(sel.External),
		Skipped: skipped(sel.InternalSkipped, sel.ExternalSkipped),
		Weights: make(map[string]uint32, len(weight)),
	}
	for a, v := range weight {
		ex.Weights[a.String()] = v
	}
	for i := range fs {
		ex.Frontends = append(ex.Frontends, fs[i].String())
	}
	return ex
}

// endpoints turns choices into plan endpoints, dropping weight 0.
func endpoints(cs []selection.Choice, weight map[netip.AddrPort]uint32) []datapath.Endpoint {
	if len(cs) == 0 {
		return nil
	}
	// Kept in the plan until the port changes: sized once, not grown.
	out := make([]datapath.Endpoint, 0, len(cs))
	for _, c := range cs {
		w := weight[c.AddrPort()]
		if w == 0 {
			continue
		}
		out = append(out, datapath.Endpoint{Addr: c.AddrPort(), Weight: w, Local: c.Local})
	}
	if len(out) == 0 {
		return nil // every weight 0: none, as a port without endpoints
	}
	return out
}

// serving lists the serving endpoints, once each: conntrack cleanup's
// reference set.
func serving(eps []model.PortEndpoint) []netip.AddrPort {
	var out []netip.AddrPort
	for _, e := range eps {
		if e.Serving && !slices.Contains(out, e.AddrPort()) {
			out = append(out, e.AddrPort())
		}
	}
	return out
}

// unionOf lists each endpoint of the given choice lists once, in order.
func unionOf(lists ...[]selection.Choice) []model.PortEndpoint {
	seen := make(map[netip.AddrPort]bool)
	var out []model.PortEndpoint
	for _, l := range lists {
		for _, c := range l {
			if !seen[c.AddrPort()] {
				seen[c.AddrPort()] = true
				out = append(out, c.PortEndpoint)
			}
		}
	}
	return out
}

func decisions(cs []selection.Choice) []Decision {
	out := make([]Decision, 0, len(cs))
	for _, c := range cs {
		out = append(out, Decision{Endpoint: c.AddrPort().String(), Node: c.NodeName, Zone: c.Zone, Local: c.Local, Reason: c.Reason})
	}
	return out
}

// skipped lists the endpoints left out, once each: one skipped for the same
// reason by internal and external traffic is listed once, as "both".
func skipped(internal, external []selection.Choice) []Decision {
	out := decisions(internal)
	for i := range out {
		out[i].Traffic = "internal"
	}
	for _, d := range decisions(external) {
		merged := false
		for i := range out {
			if out[i].Endpoint == d.Endpoint && out[i].Reason == d.Reason {
				out[i].Traffic, merged = "both", true
				break
			}
		}
		if !merged {
			d.Traffic = "external"
			out = append(out, d)
		}
	}
	return out
}

func dedupe(fs []datapath.Frontend) []datapath.Frontend {
	seen := make(map[datapath.Key]bool, len(fs))
	return slices.DeleteFunc(fs, func(f datapath.Frontend) bool {
		k := f.Key()
		if seen[k] {
			return true
		}
		seen[k] = true
		return false
	})
}

func ofFamily(as []netip.Addr, f model.Family) []netip.Addr {
	var out []netip.Addr
	for _, a := range as {
		if (f == model.IPv4) == a.Is4() {
			out = append(out, a)
		}
	}
	return out
}

func prefixesOfFamily(ps []netip.Prefix, f model.Family) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if (f == model.IPv4) == p.Addr().Is4() {
			out = append(out, p)
		}
	}
	return out
}

// primaryIPs returns the first address of each family: the node's primary
// addresses, as the Node object lists its InternalIPs first.
func primaryIPs(addrs []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if !slices.ContainsFunc(out, func(b netip.Addr) bool { return b.Is4() == a.Is4() }) {
			out = append(out, a)
		}
	}
	return out
}
