package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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
	Outage time.Duration
	Added  int
	// Gone takes the outage beyond the API server's watch cache: 80 s
	// after the drop (when every event the proxy has seen is older than
	// the cache's 75 s), objects no proxy is sent change until a watch
	// from the resourceVersion at the drop is answered 410 Gone
	// (cluster.Churn), as in a busy cluster. The outage lasts Outage or
	// until then, whichever is longer.
	Gone bool
	// Reboot restarts the proxy during the outage, after the Services
	// are added: SIGKILL, every rule and table flushed (the blackhole
	// put back), started again with the same state directory, as a node
	// that reboots while its uplink is down.
	Reboot bool
	// Quiet, when set, is a window after the cold start in which nothing
	// changes: what a quiet node's link moves (scaled to a day in the
	// report).
	Quiet time.Duration
	// Rate, when set (a tc rate: "64kbit"), shapes both directions of the
	// node's link with a token bucket (tbf) for the whole of L.
	Rate string
	// Timeout caps a proxy's wait for its endpoints at the cold start and
	// after the outage (default: the plan's Timeout); what was programmed
	// and moved by then is reported.
	Timeout time.Duration
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
	// Quiet: LinkPlan.Quiet with no change, after the cold start.
	Quiet LinkPhase `json:"quiet,omitzero"`
	// Outage: from the drop rule until 20 s after the Services added
	// during the outage are in the kernel; Seconds is link back → all in.
	Outage        LinkPhase `json:"outage"`
	OutageSeconds float64   `json:"outageSeconds"`
	Added         int       `json:"added"`
	// GoneChanges is how many times each churn object changed before the
	// resourceVersion at the drop was gone (LinkPlan.Gone).
	GoneChanges int    `json:"goneChanges,omitempty"`
	Reboot      bool   `json:"reboot,omitempty"`
	Rate        string `json:"rate,omitempty"`
	Error       string `json:"error,omitempty"`
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

// PerDay is Total scaled from Seconds to a day.
func (p LinkPhase) PerDay() int64 {
	if p.Seconds <= 0 {
		return 0
	}
	return int64(float64(p.Total()) * 86400 / p.Seconds)
}

// Requests counts a client's reads of Services, EndpointSlices, Nodes and
// ServiceCIDRs (kube-proxy watches them too):
// full reads (a LIST, or a watch with sendInitialEvents: every object
// again) and watches that resume from a resourceVersion.
type Requests struct {
	Lists      int `json:"lists"`
	Pages      int `json:"pages,omitempty"` // a LIST's next pages (continue=)
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
		case "list-page":
			q.Pages++
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

// Shape limits both directions of the node's link to rate (a tc rate:
// "64kbit") with a token bucket filter on each end of its veth; "" removes
// it. The bucket holds a frame and its queue a second at the rate, as a
// slow uplink's modem would.
func (w *World) Shape(rate string) error {
	host := []string{"tc", "qdisc", "del", "dev", w.HostIf, "root"}
	node := []string{"tc", "qdisc", "del", "dev", "host0", "root"}
	if rate != "" {
		tbf := []string{"root", "tbf", "rate", rate, "burst", "1600", "latency", "1s"}
		host = append([]string{"tc", "qdisc", "replace", "dev", w.HostIf}, tbf...)
		node = append([]string{"tc", "qdisc", "replace", "dev", "host0"}, tbf...)
	}
	if out, err := exec.Command(host[0], host[1:]...).CombinedOutput(); err != nil && rate != "" {
		return fmt.Errorf("bench: %s: %v: %s", strings.Join(host, " "), err, out)
	}
	if _, err := w.Node.Run(node[0], node[1:]...); err != nil && rate != "" {
		return err
	}
	return nil
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
	if lp.Timeout > 0 {
		defer func(t time.Duration) { r.Plan.Timeout = t }(r.Plan.Timeout)
		r.Plan.Timeout = lp.Timeout
	}
	if lp.Rate != "" {
		if err := r.World.Shape(lp.Rate); err != nil {
			return nil, err
		}
		defer func() { _ = r.World.Shape("") }()
	}
	var churn *cluster.Churn
	if lp.Gone {
		if churn, err = r.World.Cluster.NewChurn(ctx, drv.Namespace, "bench-churn"); err != nil {
			return nil, err
		}
		defer func() { _ = churn.Delete(context.WithoutCancel(ctx)) }()
	}
	var out []LinkResult
	for _, kind := range lp.Proxies {
		res := LinkResult{Proxy: kind, Backend: lp.Backend, Services: lp.Services, Endpoints: lp.Endpoints,
			Headless: lp.Headless, OtherProxy: lp.OtherProxy, Added: lp.Added, OutageSeconds: lp.Outage.Seconds(), Rate: lp.Rate, Reboot: lp.Reboot}
		err := r.linkOne(ctx, drv, churn, &res)
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

func (r *Runner) linkOne(ctx context.Context, drv *Driver, churn *cluster.Churn, res *LinkResult) error {
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
		// What moved until the proxy gave up or the cap.
		if c, cerr := w.LinkCount(); cerr == nil {
			res.Cold.In, res.Cold.Out = c.Since(c0)
			res.Cold.Seconds = time.Since(t0).Seconds()
		}
		res.Cold.Requests, _ = r.requests(res.Proxy, t0)
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

	if lp.Quiet > 0 {
		tq := time.Now()
		if err := sleep(ctx, lp.Quiet); err != nil {
			return err
		}
		cq, err := w.LinkCount()
		if err != nil {
			return err
		}
		res.Quiet.In, res.Quiet.Out = cq.Since(c1)
		res.Quiet.Seconds = time.Since(tq).Seconds()
		if res.Quiet.Requests, err = r.requests(res.Proxy, tq); err != nil {
			return err
		}
		c1 = cq
		log.Info("L quiet", "in", res.Quiet.In, "out", res.Quiet.Out, "seconds", res.Quiet.Seconds, "perDay", res.Quiet.PerDay(), "requests", res.Quiet.Requests)
		if err := x.p.Exited(); err != nil {
			return err
		}
	}

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
	// The proxy hears nothing after the drop: no resourceVersion it holds
	// is newer than rv.
	var rv string
	rvRead := time.Now()
	if churn != nil {
		if rv, err = w.Cluster.Watermark(ctx); err != nil {
			return err
		}
	}
	if err := sleep(ctx, lp.Outage/6); err != nil {
		return err
	}
	if err := drv.Grow(ctx, lp.Services+lp.Added); err != nil {
		return err
	}
	if lp.Reboot {
		if err := r.reboot(x); err != nil {
			return err
		}
		log.Info("L rebooted during the outage")
	}
	if churn != nil {
		// The churn starts when every event up to rv is older than the
		// watch caches' 75 s, so that it evicts them.
		if err := sleepUntil(ctx, rvRead.Add(80*time.Second)); err != nil {
			return err
		}
		if res.GoneChanges, err = churn.UntilGone(ctx, rv, 500, 40); err != nil {
			return err
		}
		log.Info("L resourceVersions gone", "changes", res.GoneChanges, "into the outage", time.Since(t2).Round(time.Second))
	}
	if err := sleepUntil(ctx, t2.Add(lp.Outage)); err != nil {
		return err
	}
	res.OutageSeconds = time.Since(t2).Seconds()
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

// reboot kills the proxy, flushes the node's tables (a reboot; the
// blackhole with them, which it puts back) and starts the proxy again
// with the same settings and state directory; its log so far is kept
// beside.
func (r *Runner) reboot(x *proxyRun) error {
	w := r.World
	_ = syscall.Kill(x.p.PID(), syscall.SIGKILL)
	x.p.Stop() // waits
	if err := w.Reset(); err != nil {
		return err
	}
	if err := w.Blackhole(true); err != nil {
		return err
	}
	log := filepath.Join(x.dir, string(x.p.Kind)+".log")
	_ = os.Rename(log, log+".before-reboot")
	p, err := w.Start(x.p.Kind, r.Bins, x.s, x.dir)
	if err != nil {
		return err
	}
	x.p = p
	return nil
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
	if l.Rate != "" {
		p("The link is shaped to %s both ways (tc tbf on each end of the veth).", l.Rate)
		p("")
	}
	for _, r := range rep.Link {
		if r.Reboot {
			p("%s: rebooted during the outage, after the Services were added: killed, every table flushed, started again with its state directory.", r.Proxy)
			p("")
		}
		if r.GoneChanges > 0 {
			p("%s: beyond the watch cache: a watch from the resourceVersion at the drop was answered 410 Gone after %d changes of each of a headless Service, its slice and a Node no proxy is sent; the outage lasted %.0f s.", r.Proxy, r.GoneChanges, r.OutageSeconds)
			p("")
		}
	}
	if l.Quiet.Seconds > 0 {
		p("A quiet node: %.0f s after the cold start with no change; bytes both ways, and scaled to a day.", l.Quiet.Seconds)
		p("")
		p("| proxy | quiet bytes (in + out) | per day | full reads / watches |")
		p("|---|---:|---:|---:|")
		for _, r := range rep.Link {
			if r.Quiet.Seconds > 0 {
				p("| %s | %s (%s + %s) | %s | %d / %d |", r.Proxy, num(r.Quiet.Total()), num(r.Quiet.In), num(r.Quiet.Out), num(r.Quiet.PerDay()), r.Quiet.FullReads(), r.Quiet.Watches)
			}
		}
		p("")
	}
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
			p("| %s | failed: %s; %s bytes moved in %s | | | %d / %d | | | | |", r.Proxy, r.Error, num(r.Cold.Total()), secs(r.Cold.Seconds), r.Cold.FullReads(), r.Cold.Watches)
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
