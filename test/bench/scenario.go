package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/edgeproxy/edgeproxy/test/proxies"
)

// Plan is what one run measures.
type Plan struct {
	Sizes      []int // services, ascending
	Endpoints  int   // per service
	Backends   []string
	Proxies    []ProxyKind
	Flips      int   // S2 single-endpoint flips per run
	ChurnSize  int   // S3 runs at this size only (0: the largest)
	ChurnRates []int // slice updates per second
	ChurnFor   time.Duration
	Settings   Settings
	Timeout    time.Duration // for one cold start
	Settle     time.Duration // after a cold start, before the steady measurements (default 5s)
	NFTMax     int           // largest size run on the nft backend; 0: all
	// S0, the edge-scale quiet window, runs first when S0Window > 0.
	S0Services  int           // default 100
	S0Endpoints int           // per service, default 3
	S0Window    time.Duration // 5 minutes in the full run
	// Link, when set, runs L (the link's bytes) first; LinkOnly runs
	// nothing else.
	Link     *LinkPlan `json:",omitempty"`
	LinkOnly bool      `json:",omitempty"`
}

// Result is one proxy on one backend at one size.
type Result struct {
	Scenario  string    `json:"scenario,omitempty"` // "S0" for the edge-scale window; empty for the sized runs
	Proxy     ProxyKind `json:"proxy"`
	Backend   string    `json:"backend"`
	Services  int       `json:"services"`
	Endpoints int       `json:"endpoints"`

	// S1
	ColdStart   float64 `json:"coldStartSeconds"` // start → every endpoint in the kernel
	ColdCPU     float64 `json:"coldCPUSeconds"`   // process and children
	ColdPeakRSS int64   `json:"coldPeakRSSBytes"` // process plus live children
	// The physical floor: one iptables-restore of this proxy's rule set
	// into an empty namespace, and one single-chain change on top of it.
	RuleSetBytes int64   `json:"ruleSetBytes"`
	FloorRestore float64 `json:"floorRestoreSeconds"`
	// FloorNoflush is the same restore with --noflush, as a proxy that
	// shares the tables writes (iptables-restore only).
	FloorNoflush   float64 `json:"floorNoflushSeconds,omitempty"`
	FloorOneChange float64 `json:"floorOneChangeSeconds"`

	// S2: API write → kernel-visible, seconds.
	Flips []float64 `json:"flipSeconds"`
	// FlipDelivered is, for each flip, when the API server handed the
	// written slice to the bench's own watch (Deliveries), from the write:
	// the control plane's share of the flip, the rest is the proxy's.
	FlipDelivered   []float64 `json:"flipDeliveredSeconds,omitempty"`
	FlipMetricP50   float64   `json:"flipMetricP50Seconds"` // the proxy's own network programming histogram
	FlipMetricP99   float64   `json:"flipMetricP99Seconds"`
	WatchResolution float64   `json:"watchResolutionSeconds"`
	// FlipWrites is what each flip's transactions wrote to nf_tables, from
	// the API write until the new endpoint was visible (nft backend).
	FlipWrites []Written `json:"flipWrites,omitempty"`

	// S3
	Churn []Churn `json:"churn,omitempty"`

	// S4: a quiet window of two sync periods.
	QuietWindow  float64 `json:"quietWindowSeconds"`
	QuietCPU     float64 `json:"quietCPUSeconds"`
	QuietSyncs   float64 `json:"quietSyncs"`
	KernelWrites int     `json:"kernelWrites"` // nf_tables generations; -1 where the backend has no counter

	// S0 (and the S5 fields, read after its window)
	Idle *Idle `json:"idle,omitempty"`

	// S5
	SteadyRSS  int64   `json:"steadyRSSBytes"`
	HeapAlloc  float64 `json:"heapAllocBytes"`
	Goroutines float64 `json:"goroutines"`

	Error string `json:"error,omitempty"`
}

// Churn is one S3 rate.
type Churn struct {
	Rate         int     `json:"ratePerSecond"`
	Updates      int     `json:"updates"`
	P50          float64 `json:"p50Seconds"`
	P99          float64 `json:"p99Seconds"`
	Syncs        float64 `json:"syncs"`
	CPUPerChange float64 `json:"cpuSecondsPerChange"`
	Drain        float64 `json:"drainSeconds"` // last write → backlog empty
}

// Runner runs a plan.
type Runner struct {
	World *World
	Bins  Binaries
	Plan  Plan
	Dir   string
	Log   *slog.Logger
	// LinkResults are L's results (Plan.Link), set by Run.
	LinkResults []LinkResult
}

// Run runs every size, backend and proxy in turn, one proxy at a time.
func (r *Runner) Run(ctx context.Context) ([]Result, error) {
	drv, err := NewDriver(r.World.Cluster.RESTConfig(), "bench", r.Plan.Endpoints)
	if err != nil {
		return nil, err
	}
	churnSize := r.Plan.ChurnSize
	if churnSize == 0 {
		churnSize = slices.Max(r.Plan.Sizes)
	}
	var out []Result
	if r.Plan.Link != nil {
		l, err := r.link(ctx)
		r.LinkResults = l
		if err != nil || r.Plan.LinkOnly {
			return out, err
		}
	}
	if r.Plan.S0Window > 0 {
		s0, err := r.edge(ctx)
		out = append(out, s0...)
		if err != nil {
			return out, err
		}
	}
	for _, n := range r.Plan.Sizes {
		t0 := time.Now()
		if err := drv.Grow(ctx, n); err != nil {
			return out, err
		}
		r.Log.Info("scenario written", "services", n, "endpoints", n*r.Plan.Endpoints, "took", time.Since(t0).Round(time.Millisecond))
		for _, backend := range r.Plan.Backends {
			if backend == "nft" && r.Plan.NFTMax > 0 && n > r.Plan.NFTMax {
				r.Log.Info("not run: larger than -nft-max", "backend", backend, "services", n)
				continue
			}
			for _, kind := range r.Plan.Proxies {
				if !kind.Runs(backend) {
					continue
				}
				res := Result{Proxy: kind, Backend: backend, Services: n, Endpoints: r.Plan.Endpoints}
				err := r.one(ctx, drv, &res, n == churnSize)
				if err != nil {
					if ctx.Err() != nil {
						return out, err
					}
					res.Error = err.Error()
					r.Log.Error("run failed", "proxy", kind, "backend", backend, "services", n, "err", err)
				}
				out = append(out, res)
			}
		}
	}
	return out, nil
}

// proxyRun is one proxy started cold in the emptied node namespace, with
// the kernel watcher that saw it program its rules.
type proxyRun struct {
	p     *Proxy
	k     Kernel
	watch *Watcher
	s     Settings // as given to the proxy
	dir   string   // its logs, state and saved rule set
}

// close stops the proxy, then the watcher, then the kernel reader.
func (x *proxyRun) close() {
	if x.p != nil {
		x.p.Stop()
	}
	if x.watch != nil {
		x.watch.Close()
	}
	if x.k != nil {
		x.k.Close()
	}
}

// coldStart empties the node namespace, starts res.Proxy in it and waits
// until every destination in want is in the kernel (S1), then lets the
// start settle (a first resync, the snapshot). The caller closes the run,
// also on error.
func (r *Runner) coldStart(ctx context.Context, log *slog.Logger, res *Result, want map[Dest]struct{}, name string) (*proxyRun, error) {
	x := &proxyRun{s: r.Plan.Settings}
	x.s.Backend = res.Backend
	x.dir = filepath.Join(r.Dir, "runs", fmt.Sprintf("%s-%s-%s", name, res.Backend, strings.ReplaceAll(string(res.Proxy), "+", "-")))
	_ = os.RemoveAll(x.dir)
	w := r.World
	if err := w.Reset(); err != nil {
		return x, err
	}
	var err error
	if x.k, err = w.Node.OpenKernel(res.Backend); err != nil {
		return x, err
	}
	x.watch = NewWatcher(x.k)
	var started time.Time
	x.watch.Progress = func(seen time.Time, found, want int) {
		log.Info("S1 partial", "after", seen.Sub(started).Round(time.Millisecond), "found", found, "of", want)
	}
	if x.p, err = w.Start(res.Proxy, r.Bins, x.s, x.dir); err != nil {
		return x, err
	}
	started = x.p.Started
	sampler := Sample(x.p.PID(), 100*time.Millisecond)
	seen, found, err := x.watch.WaitAll(ctx, want, r.Plan.Timeout, x.p.Exited)
	peak := sampler.Stop()
	if err != nil {
		return x, fmt.Errorf("cold start: %d of %d endpoints after %s: %w", found, len(want), time.Since(x.p.Started).Round(time.Second), err)
	}
	res.ColdStart = seen.Sub(x.p.Started).Seconds()
	u, _ := ReadUsage(x.p.PID())
	res.ColdCPU, res.ColdPeakRSS = u.CPU.Seconds(), peak
	log.Info("S1 cold start", "seconds", res.ColdStart, "cpu", res.ColdCPU, "peakRSS", peak)
	settle := r.Plan.Settle
	if settle == 0 {
		settle = 5 * time.Second
	}
	return x, sleep(ctx, settle)
}

func (r *Runner) one(ctx context.Context, drv *Driver, res *Result, churn bool) error {
	log := r.Log.With("proxy", res.Proxy, "backend", res.Backend, "services", res.Services)
	x, err := r.coldStart(ctx, log, res, drv.Expected(), fmt.Sprint(res.Services))
	defer x.close()
	if err != nil {
		return err
	}
	p, k, watch, s, dir := x.p, x.k, x.watch, x.s, x.dir

	// S5: footprint at rest.
	if m, err := p.Scrape(ctx); err == nil {
		res.HeapAlloc, res.Goroutines = m.Sum("go_memstats_heap_alloc_bytes"), m.Sum("go_goroutines")
	}
	if u, err := ReadUsage(p.PID()); err == nil {
		res.SteadyRSS = u.RSS
	}

	// S4: a quiet window of two sync periods.
	if err := r.quiet(ctx, p, k, res); err != nil {
		return err
	}
	log.Info("S4 quiet", "cpu", res.QuietCPU, "syncs", res.QuietSyncs, "kernelWrites", res.KernelWrites)

	// S2: single flips, each after the previous is visible and a min-sync period has passed.
	before, _ := p.Scrape(ctx)
	deliveries, err := drv.WatchDeliveries(ctx)
	if err != nil {
		return err
	}
	defer deliveries.Stop()
	rng := rand.New(rand.NewPCG(uint64(res.Services), 7))
	for f := range r.Plan.Flips {
		i, j := rng.IntN(res.Services), f%r.Plan.Endpoints
		w0 := watch.Written()
		added, wrote, err := drv.Flip(ctx, i, j)
		if err != nil {
			return err
		}
		seen, err := watch.WaitFlip(ctx, added, 60*time.Second)
		if err != nil {
			return fmt.Errorf("flip %d: %w", f, err)
		}
		delivered, err := deliveries.Wait(ctx, drv.Version(i), 60*time.Second)
		if err != nil {
			return fmt.Errorf("flip %d: %w", f, err)
		}
		res.Flips = append(res.Flips, max(0, seen.Sub(wrote).Seconds()))
		res.FlipDelivered = append(res.FlipDelivered, max(0, delivered.Sub(wrote).Seconds()))
		if _, ok := k.(*nftKernel); ok {
			res.FlipWrites = append(res.FlipWrites, watch.Written().Sub(w0))
		}
		if err := sleep(ctx, s.MinSync+100*time.Millisecond); err != nil {
			return err
		}
	}
	if after, err := p.Scrape(ctx); err == nil {
		h := "kubeproxy_network_programming_duration_seconds"
		res.FlipMetricP50 = proxies.HistQuantile(after, before, h, 0.5)
		res.FlipMetricP99 = proxies.HistQuantile(after, before, h, 0.99)
	}
	res.WatchResolution = watch.Resolution().Seconds()
	log.Info("S2 flips", "n", len(res.Flips), "p50", quantile(res.Flips, 0.5), "p99", quantile(res.Flips, 0.99))

	// S3: churn.
	if churn && res.Proxy != EdgeProxyWasm {
		for _, rate := range r.Plan.ChurnRates {
			c, err := r.churn(ctx, drv, p, watch, rate, res.Services)
			if err != nil {
				return fmt.Errorf("churn at %d/s: %w", rate, err)
			}
			res.Churn = append(res.Churn, c)
			log.Info("S3 churn", "rate", rate, "p50", c.P50, "p99", c.P99, "drain", c.Drain, "syncs", c.Syncs)
		}
	}
	if err := p.Exited(); err != nil {
		return err
	}
	p.Stop()

	// The floor, on the rule set this proxy wrote.
	return r.floor(ctx, res, dir)
}

func (r *Runner) quiet(ctx context.Context, p *Proxy, k Kernel, res *Result) error {
	window := 2*r.Plan.Settings.Sync + 2*time.Second
	// The window holds none of the harness's own requests: the proxy
	// serves the scrapes before it (given a second to finish the work a
	// scrape leaves) and after it.
	m0, _ := p.Scrape(ctx)
	if err := sleep(ctx, time.Second); err != nil {
		return err
	}
	u0, _ := ReadUsage(p.PID())
	g0, _ := k.Generation()
	if err := sleep(ctx, window); err != nil {
		return err
	}
	u1, _ := ReadUsage(p.PID())
	g1, _ := k.Generation()
	m1, _ := p.Scrape(ctx)
	res.QuietWindow = window.Seconds()
	res.QuietCPU = (u1.Run - u0.Run).Seconds()
	sync := "kubeproxy_sync_proxy_rules_duration_seconds_count"
	res.QuietSyncs = m1.Sum(sync) - m0.Sum(sync)
	res.KernelWrites = -1
	if _, ok := k.(*nftKernel); ok {
		res.KernelWrites = int(g1 - g0)
	}
	return nil
}

func (r *Runner) churn(ctx context.Context, drv *Driver, p *Proxy, watch *Watcher, rate, services int) (Churn, error) {
	c := Churn{Rate: rate}
	m0, _ := p.Scrape(ctx)
	u0, _ := ReadUsage(p.PID())
	var mu sync.Mutex
	pending := map[Dest]time.Time{}
	var lat []float64
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	werr := make(chan error, 1)
	var last time.Time
	go func() {
		defer close(werr)
		t := time.NewTicker(time.Second / time.Duration(rate))
		defer t.Stop()
		end := time.Now().Add(r.Plan.ChurnFor)
		for k := 0; time.Now().Before(end); k++ {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
			// A rolling update: services in turn, a different endpoint each round.
			added, wrote, err := drv.Flip(wctx, k%services, (k/services)%drv.Endpoints)
			if err != nil {
				werr <- err
				return
			}
			mu.Lock()
			pending[added] = wrote
			last = wrote
			c.Updates++
			mu.Unlock()
		}
	}()
	writing := true
	deadline := time.Now().Add(r.Plan.ChurnFor + 2*time.Minute)
	for {
		if time.Now().After(deadline) {
			return c, fmt.Errorf("backlog of %d updates not drained 2m after the last write", len(pending))
		}
		seen, err := watch.PollFor(ctx, time.Second)
		if err != nil && !errors.Is(err, errQuiet) {
			return c, err
		}
		mu.Lock()
		if err == nil {
			for d, w := range pending {
				if watch.Has(d) {
					lat = append(lat, max(0, seen.Sub(w).Seconds()))
					delete(pending, d)
				}
			}
		}
		mu.Unlock()
		if writing {
			select {
			case err, ok := <-werr:
				if err != nil {
					return c, err
				}
				if !ok {
					writing = false
				}
			default:
			}
		}
		mu.Lock()
		n := len(pending)
		mu.Unlock()
		if !writing && n == 0 {
			c.Drain = max(0, time.Since(last).Seconds())
			break
		}
		if err := p.Exited(); err != nil {
			return c, err
		}
	}
	m1, _ := p.Scrape(ctx)
	u1, _ := ReadUsage(p.PID())
	c.P50, c.P99 = quantile(lat, 0.5), quantile(lat, 0.99)
	sync := "kubeproxy_sync_proxy_rules_duration_seconds_count"
	c.Syncs = m1.Sum(sync) - m0.Sum(sync)
	if c.Updates > 0 {
		c.CPUPerChange = (u1.CPU - u0.CPU).Seconds() / float64(c.Updates)
	}
	return c, nil
}

// floor measures one restore of the rule set the proxy left in the node
// namespace, into a fresh namespace watched as the proxies' runs are
// (watched), then the median of five single-chain
// changes on top of it: with iptables-restore, or for kube-proxy's
// nftables mode with nft -f (its tables, both families).
func (r *Runner) floor(ctx context.Context, res *Result, dir string) error {
	if res.Proxy == EdgeProxyNFT {
		// Its own tables over netlink: the floor is one netlink batch of
		// the same objects (nftfloor.go), not a program's text.
		n, err := r.nftFloor(res, "edgeproxy", "svc-")
		res.RuleSetBytes = int64(n)
		if err != nil {
			return err
		}
		return ctx.Err()
	}
	save, err := r.ruleSet(res)
	if err != nil {
		return err
	}
	res.RuleSetBytes = int64(len(save))
	path := filepath.Join(dir, "ruleset.txt")
	if err := os.WriteFile(path, []byte(save), 0o600); err != nil {
		return err
	}
	ns, err := NewNetns("floor")
	if err != nil {
		return err
	}
	defer ns.Close()
	stop, err := watched(ns, res.Backend)
	if err != nil {
		return err
	}
	defer stop()
	restore, args, noflush := "iptables-"+res.Backend+"-restore", []string{}, []string{"--noflush"}
	change := "*nat\n:EPB-FLOOR - [0:0]\n-A EPB-FLOOR -p tcp -j DNAT --to-destination 10.63.0.%d:8080\nCOMMIT\n"
	if res.Proxy == KubeProxyNFT {
		restore, args, noflush = "nft", []string{"-f", "-"}, []string{"-f", "-"}
		change = "add chain ip kube-proxy epb-floor-%[1]d\nadd rule ip kube-proxy epb-floor-%[1]d meta l4proto tcp dnat to 10.63.0.%[1]d:8080\n"
	}
	d, err := timed(ns, restore, args, save)
	if err != nil {
		return err
	}
	res.FloorRestore = d.Seconds()
	if res.Proxy != KubeProxyNFT {
		if res.FloorNoflush, err = r.floorNoflush(restore, res.Backend, save); err != nil {
			return err
		}
	}
	var one []float64
	for i := range 5 {
		d, err := timed(ns, restore, noflush, fmt.Sprintf(change, i+1))
		if err != nil {
			return err
		}
		one = append(one, d.Seconds())
	}
	res.FloorOneChange = quantile(one, 0.5)
	return ctx.Err()
}

// floorNoflush is one restore of save with --noflush into an empty
// namespace of its own, watched as floor's.
func (r *Runner) floorNoflush(restore, backend, save string) (float64, error) {
	ns, err := NewNetns("floor-noflush")
	if err != nil {
		return 0, err
	}
	defer ns.Close()
	stop, err := watched(ns, backend)
	if err != nil {
		return 0, err
	}
	defer stop()
	d, err := timed(ns, restore, []string{"--noflush"}, save)
	return d.Seconds(), err
}

// ruleSet is the text that restores the rules the proxy wrote.
func (r *Runner) ruleSet(res *Result) (string, error) {
	if res.Proxy == KubeProxyNFT {
		var b strings.Builder
		for _, fam := range []string{"ip", "ip6"} {
			out, err := r.World.Node.Command("nft", "list", "table", fam, "kube-proxy").Output()
			if err != nil {
				return "", fmt.Errorf("bench: nft list table %s kube-proxy: %w", fam, err)
			}
			b.Write(out)
		}
		return b.String(), nil
	}
	cmd := r.World.Node.Command("iptables-" + res.Backend + "-save")
	b, err := cmd.Output() // stdout only: iptables-nft-save warns on stderr
	if err != nil {
		return "", fmt.Errorf("bench: iptables-%s-save: %w", res.Backend, err)
	}
	// kube-proxy counts dropped invalid packets in an nfacct object it
	// creates over netlink; an empty namespace has none, so the match goes
	// (the rule stays).
	return nfacctMatch.ReplaceAllString(string(b), ""), nil
}

var nfacctMatch = regexp.MustCompile(` -m nfacct --nfacct-name +\S+`)

func timed(ns *Netns, name string, args []string, stdin string) (time.Duration, error) {
	// Started from a thread inside the namespace (not through ip netns
	// exec), as a proxy starts its own restores.
	cmd := exec.Command(name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	var d time.Duration
	err := ns.Do(func() error {
		t := time.Now()
		err := cmd.Run()
		d = time.Since(t)
		return err
	})
	if err != nil {
		return d, fmt.Errorf("bench: %s %v: %v: %s", name, args, err, out.String())
	}
	return d, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// quantile of xs (nearest rank); NaN when empty.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}
