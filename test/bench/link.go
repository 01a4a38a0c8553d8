package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/edgeproxy/edgeproxy/test/cluster"
)

// The link scenario (L): what a proxy moves over the node's one link to
// the API server, at a cold start and through an outage, as an edge node
// on a metered uplink pays for it. The world is the proxies' own (Services
// × endpoints) plus headless Services and Services for another proxy
// (WriteIgnored), which no proxy here programs.

// LinkPlan is what L measures.
type LinkPlan struct {
	Services   int
	Endpoints  int // per Service (and per ignored Service)
	Headless   int
	OtherProxy int
	// Outage is a blackhole: every packet between the node and the API
	// server dropped in the node (not a closed port: a refused connection
	// takes another path in client-go). Added Services are written during
	// it.
	Outage  time.Duration
	Added   int
	Backend string
	Proxies []ProxyKind
}

// LinkResult is one proxy's L.
type LinkResult struct {
	Proxy      ProxyKind `json:"proxy"`
	Backend    string    `json:"backend"`
	Services   int       `json:"services"`
	Endpoints  int       `json:"endpoints"`
	Headless   int       `json:"headless"`
	OtherProxy int       `json:"otherProxy"`
	// Cold: process start until 10 s after every endpoint is in the
	// kernel; Seconds is start → every endpoint.
	Cold LinkPhase `json:"coldStart"`
	// Outage: from the drop rule until 20 s after the Services added
	// during the outage are in the kernel; Seconds is link back → all in.
	Outage        LinkPhase `json:"outage"`
	OutageSeconds float64   `json:"outageSeconds"`
	Added         int       `json:"added"`
	Error         string    `json:"error,omitempty"`
}

// LinkPhase is what crossed the link in a phase, and what the proxy asked
// the API server for (from its audit log).
type LinkPhase struct {
	In      int64   `json:"inBytes"`  // IP bytes to the node
	Out     int64   `json:"outBytes"` // IP bytes from the node
	Seconds float64 `json:"seconds"`
	Requests
}

// Total is the bytes both ways.
func (p LinkPhase) Total() int64 { return p.In + p.Out }

// Requests counts a client's reads of Services, EndpointSlices, Nodes and
// ServiceCIDRs (kube-proxy watches them too):
// full reads (a LIST, or a watch with sendInitialEvents: every object
// again) and watches that resume from a resourceVersion.
type Requests struct {
	Lists      int `json:"lists"`
	WatchLists int `json:"watchLists"`
	Watches    int `json:"watches"`
	Gone       int `json:"gone"` // answered 410 Gone: too old a resourceVersion
}

// FullReads is Lists + WatchLists.
func (q Requests) FullReads() int { return q.Lists + q.WatchLists }

// CountRequests sorts audit events into Requests (AuditEvent.Read).
func CountRequests(evs []cluster.AuditEvent) Requests {
	var q Requests
	for _, e := range evs {
		switch e.Resource() {
		case "services", "endpointslices", "nodes", "servicecidrs":
		default:
			continue
		}
		if e.ResponseStatus != nil && e.ResponseStatus.Code == 410 && e.Stage == "ResponseComplete" {
			q.Gone++
		}
		switch e.Read() {
		case "watch-list":
			q.WatchLists++
		case "watch":
			q.Watches++
		case "list":
			q.Lists++
		}
	}
	return q
}

// userAgent is how the audit log names each proxy's requests.
func (kind ProxyKind) userAgent() string {
	if kind.upstream() {
		return "kube-proxy/"
	}
	return "edgeproxy"
}

// LinkCount is the host side of the node's veth: bytes and packets each
// way, as its kernel counters have them.
type LinkCount struct{ RxBytes, TxBytes, RxPackets, TxPackets int64 }

// LinkCount reads the link's counters now.
func (w *World) LinkCount() (LinkCount, error) {
	var c LinkCount
	for _, f := range []struct {
		name string
		v    *int64
	}{{"rx_bytes", &c.RxBytes}, {"tx_bytes", &c.TxBytes}, {"rx_packets", &c.RxPackets}, {"tx_packets", &c.TxPackets}} {
		b, err := os.ReadFile(filepath.Join("/sys/class/net", w.HostIf, "statistics", f.name))
		if err != nil {
			return c, fmt.Errorf("bench: link counters: %w", err)
		}
		if *f.v, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err != nil {
			return c, fmt.Errorf("bench: link counters: %w", err)
		}
	}
	return c, nil
}

// ethHeader is what a veth counts per frame beyond the IP packet.
const ethHeader = 14

// Since is what crossed since c0, at IP level: in is to the node (the
// host side transmitted it), out is from the node.
func (c LinkCount) Since(c0 LinkCount) (in, out int64) {
	in = (c.TxBytes - c0.TxBytes) - ethHeader*(c.TxPackets-c0.TxPackets)
	out = (c.RxBytes - c0.RxBytes) - ethHeader*(c.RxPackets-c0.RxPackets)
	return in, out
}

// Blackhole drops (on) or stops dropping (off) every packet between the
// node and the API server, inside the node namespace.
func (w *World) Blackhole(on bool) error {
	op := "-D"
	if on {
		op = "-I"
	}
	for _, rule := range [][]string{{"INPUT", "-s", w.HostIP.String()}, {"OUTPUT", "-d", w.HostIP.String()}} {
		args := append([]string{op, rule[0]}, append(rule[1:], "-j", "DROP")...)
		if _, err := w.Node.Run("iptables", args...); err != nil {
			return err
		}
	}
	return nil
}

// link runs L for every proxy in the plan, one at a time, each in the same
// world; it deletes what it wrote when done.
func (r *Runner) link(ctx context.Context) ([]LinkResult, error) {
	lp := r.Plan.Link
	drv, err := NewDriver(r.World.Cluster.RESTConfig(), "bench-link", lp.Endpoints)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	if err := drv.Grow(ctx, lp.Services); err != nil {
		return nil, err
	}
	if err := drv.WriteIgnored(ctx, lp.Headless, lp.OtherProxy); err != nil {
		return nil, err
	}
	r.Log.Info("L world written", "services", lp.Services, "headless", lp.Headless, "otherProxy", lp.OtherProxy, "took", time.Since(t0).Round(time.Millisecond))
	var out []LinkResult
	for _, kind := range lp.Proxies {
		res := LinkResult{Proxy: kind, Backend: lp.Backend, Services: lp.Services, Endpoints: lp.Endpoints,
			Headless: lp.Headless, OtherProxy: lp.OtherProxy, Added: lp.Added, OutageSeconds: lp.Outage.Seconds()}
		err := r.linkOne(ctx, drv, &res)
		if err != nil {
			if ctx.Err() != nil {
				return out, err
			}
			res.Error = err.Error()
			r.Log.Error("L failed", "proxy", kind, "err", err)
		}
		out = append(out, res)
		// The next proxy finds the world as this one did.
		if err := drv.Shrink(ctx, lp.Services); err != nil {
			return out, err
		}
	}
	if err := drv.ClearIgnored(ctx, lp.Headless, lp.OtherProxy); err != nil {
		return out, err
	}
	return out, drv.Clear(ctx)
}

func (r *Runner) linkOne(ctx context.Context, drv *Driver, res *LinkResult) error {
	w, lp := r.World, r.Plan.Link
	log := r.Log.With("scenario", "L", "proxy", res.Proxy)
	c0, err := w.LinkCount()
	if err != nil {
		return err
	}
	t0 := time.Now()
	s1 := &Result{Proxy: res.Proxy, Backend: res.Backend, Services: res.Services, Endpoints: res.Endpoints}
	x, err := r.coldStart(ctx, log, s1, drv.Expected(), "link")
	defer x.close()
	if err != nil {
		return err
	}
	res.Cold.Seconds = s1.ColdStart
	if err := sleepUntil(ctx, x.p.Started.Add(time.Duration(s1.ColdStart*float64(time.Second))+10*time.Second)); err != nil {
		return err
	}
	c1, err := w.LinkCount()
	if err != nil {
		return err
	}
	res.Cold.In, res.Cold.Out = c1.Since(c0)
	if res.Cold.Requests, err = r.requests(res.Proxy, t0); err != nil {
		return err
	}
	log.Info("L cold start", "in", res.Cold.In, "out", res.Cold.Out, "seconds", res.Cold.Seconds, "requests", res.Cold.Requests)

	// The outage: the drop rule, Services added a sixth of the way in,
	// the link back, the added Services programmed, 20 s more.
	t2 := time.Now()
	if err := w.Blackhole(true); err != nil {
		return err
	}
	dropped := true
	defer func() {
		if dropped {
			_ = w.Blackhole(false)
		}
	}()
	if err := sleep(ctx, lp.Outage/6); err != nil {
		return err
	}
	if err := drv.Grow(ctx, lp.Services+lp.Added); err != nil {
		return err
	}
	if err := sleepUntil(ctx, t2.Add(lp.Outage)); err != nil {
		return err
	}
	if err := x.p.Exited(); err != nil {
		return err
	}
	if err := w.Blackhole(false); err != nil {
		return err
	}
	dropped = false
	back := time.Now()
	seen, found, err := x.watch.WaitAll(ctx, drv.Expected(), r.Plan.Timeout, x.p.Exited)
	if err != nil {
		return fmt.Errorf("after the outage: %d endpoints of %d: %w", found, len(drv.Expected()), err)
	}
	res.Outage.Seconds = max(0, seen.Sub(back).Seconds())
	if err := sleepUntil(ctx, seen.Add(20*time.Second)); err != nil {
		return err
	}
	c3, err := w.LinkCount()
	if err != nil {
		return err
	}
	res.Outage.In, res.Outage.Out = c3.Since(c1)
	if res.Outage.Requests, err = r.requests(res.Proxy, t2); err != nil {
		return err
	}
	log.Info("L outage", "in", res.Outage.In, "out", res.Outage.Out, "converged", res.Outage.Seconds, "requests", res.Outage.Requests)
	return x.p.Exited()
}

// requests counts the proxy's reads since t from the audit log (zero
// when the cluster keeps none).
func (r *Runner) requests(kind ProxyKind, since time.Time) (Requests, error) {
	evs, err := r.World.Cluster.AuditEvents(kind.userAgent(), since)
	if err != nil {
		return Requests{}, err
	}
	return CountRequests(evs), nil
}

func sleepUntil(ctx context.Context, t time.Time) error { return sleep(ctx, time.Until(t)) }

// linkSection writes L's table: each proxy's bytes, against kube-proxy's.
func (rep *Report) linkSection(p func(string, ...any)) {
	if len(rep.Link) == 0 {
		return
	}
	l := rep.Link[0]
	p("## L the link: %d Services × %d endpoints + %d headless + %d for another proxy, iptables-%s", l.Services, l.Endpoints, l.Headless, l.OtherProxy, l.Backend)
	p("")
	p("Bytes both ways at IP level on the node's one veth (its kernel counters, less 14 bytes of Ethernet header a frame). Cold start: process start until 10 s after every endpoint is in the kernel. Outage: a %.0f s blackhole (a drop rule in the node) with %d Services added during it, until 20 s after they are in the kernel. Reads from the API server's audit log: full (LIST, or watch with sendInitialEvents) / resumed watches.", l.OutageSeconds, l.Added)
	p("")
	p("| proxy | cold start bytes (in + out) | vs kube-proxy | programmed | full reads / watches | outage bytes | vs kube-proxy | converged after the link is back | full reads / watches |")
	p("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	var kp *LinkResult
	for i := range rep.Link {
		if rep.Link[i].Proxy == KubeProxy && rep.Link[i].Error == "" {
			kp = &rep.Link[i]
		}
	}
	vs := func(v, ref int64) string {
		if kp == nil || ref == 0 {
			return "—"
		}
		return fmt.Sprintf("%.3f×", float64(v)/float64(ref))
	}
	for _, r := range rep.Link {
		if r.Error != "" {
			p("| %s | failed: %s | | | | | | | |", r.Proxy, r.Error)
			continue
		}
		var kc, ko int64
		if kp != nil {
			kc, ko = kp.Cold.Total(), kp.Outage.Total()
		}
		p("| %s | %s (%s + %s) | %s | %s | %d / %d | %s (%s + %s) | %s | %s | %d / %d |", r.Proxy,
			num(r.Cold.Total()), num(r.Cold.In), num(r.Cold.Out), vs(r.Cold.Total(), kc), secs(r.Cold.Seconds), r.Cold.FullReads(), r.Cold.Watches,
			num(r.Outage.Total()), num(r.Outage.In), num(r.Outage.Out), vs(r.Outage.Total(), ko), secs(r.Outage.Seconds), r.Outage.FullReads(), r.Outage.Watches)
	}
	p("")
}

// num writes n with thousands separators.
func num(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
