// Package agent wires edgeproxy together: a source feeds the state, the sync
// runner turns state snapshots into plans (selection, then policy) and hands
// them to the datapath backend, and small HTTP servers report health,
// metrics and the current plan. Config reloads reach every stage.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"net/netip"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/healthcheck"
	"github.com/edgeproxy/edgeproxy/agent/notify"
	"github.com/edgeproxy/edgeproxy/agent/planner"
	"github.com/edgeproxy/edgeproxy/agent/policychain"
	"github.com/edgeproxy/edgeproxy/agent/prober"
	"github.com/edgeproxy/edgeproxy/agent/runner"
	"github.com/edgeproxy/edgeproxy/agent/snapshot"
	"github.com/edgeproxy/edgeproxy/agent/source"
	"github.com/edgeproxy/edgeproxy/agent/state"
	"github.com/edgeproxy/edgeproxy/datapath"
)

// Source is where objects come from: the API server or a manifest directory.
type Source interface {
	Run(ctx context.Context) error
	WaitForSync(ctx context.Context) bool
}

// Options configure an Agent.
type Options struct {
	Config *config.Config
	// Load is how Config was loaded; with a file named, the agent watches
	// it and reloads. Zero: no reload.
	Load config.LoadOptions
	// Logger and LogLevel: the agent changes LogLevel on config reloads.
	Logger   *slog.Logger
	LogLevel *slog.LevelVar
	// Registry receives every metric and is served on /metrics.
	Registry *prometheus.Registry
	// Backend overrides the backend chosen by Config.Mode (tests, `plan`).
	Backend datapath.Backend
	// Policy weighs endpoints after built-in selection; nil: equal weights.
	Policy planner.Policy
	// Version is reported on /debug/status.
	Version string
	// ProbeDial overrides the endpoint probe (tests); nil: TCP connect.
	ProbeDial prober.DialFunc
}

// Agent is one running edgeproxy.
type Agent struct {
	opts    Options
	log     *slog.Logger
	cfg     atomic.Pointer[config.Config]
	state   *state.State
	source  Source
	api     *source.API  // nil with a manifest source
	link    *source.Link // the API client's connections; nil with a manifest source
	backend datapath.Backend
	planner *planner.Planner
	runner  *runner.Runner
	health  *healthcheck.Servers
	watcher *config.Watcher
	metrics *metrics
	chains  *chainPolicy // nil when the caller supplied its own policy

	quarantine *quarantine               // under mu
	last       atomic.Pointer[published] // read without mu

	mu sync.Mutex // guards the fields below; held by sync
	// What the syncs left for the next one's decision (decide): a full
	// sync owed (the first, after a failed apply, tampering or a reload);
	// when the last compare ran, and the snapshot generation it compared;
	// of the last successful apply, the generation it carried and whether
	// it came from the on-disk snapshot; deferred: a compare that came due
	// with changes waiting was left to the next sync.
	needFull               bool
	lastFull               time.Time
	syncedGen, comparedGen uint64
	syncedOffline          bool
	deferred               bool
	triggers               []time.Time
	lastErr                error
	synced                 chan struct{} // closed after the first successful apply
	// firstSynced is when that apply ended (unix ns), for health: the
	// runner records the sync's success only once the sync returns.
	firstSynced atomic.Int64
	syncOnce    sync.Once
	startTime   time.Time

	notifier *notify.Notifier
	snaps    *snapshotWriter
	gc       *betweenSyncs
	// snapAge holds the written stamp (Unix ns) of the snapshot on disk,
	// written or loaded; 0: none known.
	snapAge      atomic.Int64
	fromSnapshot atomic.Bool
	// loaded is the snapshot a reboot loaded before the source starts,
	// until resumeFromSnapshot (which sets resumeAsked) has used it.
	loaded      *snapshot.Snapshot
	resumeAsked bool
	probes      *probing // nil with health.mode: off
	// nodeIneligible mirrors the last synced Node's Ineligible.
	nodeIneligible atomic.Bool
	// externalIPsWarned: Services already warned about ignored
	// externalIPs (under mu).
	externalIPsWarned map[string]bool
	// kubeProxy: what the agent found and removed of kube-proxy's.
	kubeProxy *kubeProxyTakeover
}

// New builds an agent; nothing runs until Run.
func New(opts Options) (*Agent, error) {
	cfg := opts.Config
	if cfg == nil {
		return nil, errors.New("agent: no config")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	a := &Agent{opts: opts, log: opts.Logger, needFull: true, synced: make(chan struct{}), startTime: time.Now()}
	a.cfg.Store(cfg)
	if limit := setMemoryLimit(cfg.Memory, a.log); limit > 0 {
		a.log.Info("Go memory limit set", "bytes", limit)
	}
	a.runner = runner.New("sync", a.sync, cfg.Sync.MinPeriod, cfg.Sync.MinPeriod, cfg.Sync.Period, nil)
	a.runner.SetLogger(a.log)
	a.state = state.New(a.runner.Run)
	if opts.Policy == nil {
		// The evaluator exists even without chains, so that a config
		// reload can add some.
		cp, err := newChainPolicy(context.Background(), cfg, a.log, opts.Registry)
		if err != nil {
			return nil, fmt.Errorf("agent: policy: %w", err)
		}
		a.chains, a.opts.Policy = cp, cp
	}
	a.planner = planner.New(planner.Options{ExternalIPs: cfg.ExternalIPs}, a.opts.Policy)
	a.metrics = newMetrics(opts.Registry, a.state, a.apiContactSeconds, a.snapshotAgeSeconds)
	a.quarantine = newQuarantine(opts.Registry, a.log)
	a.gc = newBetweenSyncs()
	a.snaps = newSnapshotWriter(cfg.StateDir, a.log, a.metrics.snapshotWriteFailures, &a.snapAge)
	a.snaps.gc = a.gc
	a.snaps.failed = a.runner.Unrest
	a.kubeProxy = newKubeProxyTakeover(opts.Registry)
	var err error
	// The sync loop sleeps for as long as an hour on a quiet node (see
	// restWhenQuiet): the watchdog follows what it owes, not its last run.
	owed := func() time.Time { return a.runner.Status().PendingSince }
	if a.notifier, err = notify.New(notify.Options{Logger: a.log.With("component", "systemd"), Owed: owed}); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}

	conv := &source.Converter{ProxyName: cfg.ProxyName, KeepPrefix: cfg.ServiceKeyPrefix}
	srcMetrics := source.NewMetrics(opts.Registry)
	if cfg.Manifests != "" {
		var d *source.Dir
		if d, err = source.NewDir(cfg.Manifests, cfg.NodeName, conv, a.state, a.log.With("source", "manifests"), srcMetrics); err == nil {
			d.SetMaxFileSize(int64(cfg.MaxManifestSize))
			a.source = d
		}
	} else {
		var client kubernetes.Interface
		link := source.NewLink()
		if client, err = newClient(cfg.Kubeconfig, link); err == nil {
			a.api, err = source.NewAPI(client, link, cfg.NodeName, conv, a.state, a.log.With("source", "api"), srcMetrics)
			a.source, a.link = a.api, link
			registerLinkMetrics(opts.Registry, link)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}

	a.backend = opts.Backend
	if a.backend == nil {
		if a.backend, err = NewBackend(cfg, a.log, opts.Registry); err != nil {
			return nil, fmt.Errorf("agent: %w", err)
		}
	}
	a.probes = a.newProbing(opts.Registry)
	if cfg.Mode != config.ModePlan {
		applyConntrack(cfg.Conntrack, a.log)
		a.health = healthcheck.New(healthcheck.Options{Logger: a.log.With("component", "healthcheck"),
			ProxyHealthy: func() bool { return a.HealthNow(time.Now()).Healthy }})
	}
	if path := opts.Load.Path(); path != "" {
		a.watcher, err = config.NewWatcher(cfg, config.WatcherOptions{
			Load: opts.Load, Registerer: opts.Registry, Logger: a.log.With("component", "config"),
			OnChange: a.reconfigure,
		})
		if err != nil {
			return nil, fmt.Errorf("agent: %w", err)
		}
	}
	return a, nil
}

// newClient builds an API client from a kubeconfig path, or from the
// in-cluster environment when path is empty, whose connections are dialed
// with dial.
func newClient(path string, link *source.Link) (kubernetes.Interface, error) {
	source.PreferList()
	var rc *rest.Config
	var err error
	if path == "" {
		rc, err = rest.InClusterConfig()
	} else {
		rc, err = clientcmd.BuildConfigFromFlags("", path)
	}
	if err != nil {
		return nil, fmt.Errorf("api client: %w", err)
	}
	rc.UserAgent = "edgeproxy"
	rc.Dial = link.DialContext
	rc.Wrap(link.WrapTransport)
	// Protocol buffers, as kube-proxy asks for: the list of thousands of
	// EndpointSlices at start decodes several times faster than JSON.
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	// Lists of thousands of slices at start must not be throttled.
	rc.QPS, rc.Burst = 50, 100
	return kubernetes.NewForConfig(rc)
}

// Config returns the running config.
func (a *Agent) Config() *config.Config { return a.cfg.Load() }

// Backend returns the datapath backend.
func (a *Agent) Backend() datapath.Backend { return a.backend }

// Synced is closed after the first successful programming.
func (a *Agent) Synced() <-chan struct{} { return a.synced }

// Run starts every part and returns when ctx is done. It returns an error
// only when a part cannot start (e.g. a listen address is taken) or fails.
func (a *Agent) Run(ctx context.Context) error {
	servers, err := a.listen()
	if err != nil {
		return err
	}
	eg, gctx := errgroup.WithContext(ctx)
	g := &parts{ctx: gctx, eg: eg}
	for _, s := range servers {
		g.run("http "+s.name, s.serve)
	}
	rebooted := a.startAfterReboot(gctx)
	a.resumeFromSnapshot()
	a.startParts(g)
	a.log.Info("waiting for the source to list everything", "mode", a.backend.Name(), "node", a.Config().NodeName)
	_ = a.notifier.Status("waiting for the API server")
	a.startSyncing(gctx, g, rebooted)

	<-gctx.Done() // ctx is done, or a part failed
	if ctx.Err() == nil {
		a.log.Error("stopping", "err", context.Cause(gctx))
	}
	_ = a.notifier.Stopping()
	err = eg.Wait()
	a.snaps.wait()
	if a.chains != nil {
		if cerr := a.chains.Close(context.Background()); cerr != nil {
			a.log.Warn("closing the policy engine", "err", cerr)
		}
	}
	return err
}

// parts are the agent's goroutines, all ended by ctx, which the first
// error of one (while ctx lives) cancels: that error stops the agent, and
// what the others return as they stop is dropped.
type parts struct {
	ctx context.Context
	eg  *errgroup.Group
}

func (g *parts) run(name string, fn func(context.Context) error) {
	g.eg.Go(func() error {
		if err := fn(g.ctx); err != nil && g.ctx.Err() == nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	})
}

// startParts starts what runs beside the sync loop: the source, the
// prober, the config watcher, the health-check servers' closer, the tamper
// monitor and the systemd notifier; and it cleans up the other mode's
// kernel objects.
func (a *Agent) startParts(g *parts) {
	g.run("source", a.source.Run)
	if a.probes != nil {
		g.run("endpoint prober", func(ctx context.Context) error { a.runProbing(ctx); return nil })
	}
	if a.watcher != nil {
		g.run("config watcher", a.watcher.Run)
	}
	if a.health != nil {
		g.run("healthcheck", func(ctx context.Context) error {
			<-ctx.Done()
			return a.health.Close()
		})
	}
	if m, ok := a.backend.(datapath.Monitor); ok {
		g.run("tamper monitor", func(ctx context.Context) error { a.monitor(ctx, m); return nil })
	}
	g.run("systemd notify", a.notifier.Run)
	if a.opts.Backend == nil {
		cleanupOtherMode(g.ctx, a.Config(), a.log)
	}
	if takesOver(a.Config(), a.opts.Backend == nil) {
		g.run("kube-proxy takeover", func(ctx context.Context) error { a.takeOverFromKubeProxy(ctx); return nil })
	}
}

// startSyncing starts the sync loop once there is something to program:
// at once after a reboot that restored the last known state; else when the
// source has listed everything, or, if the API server stays away for
// offline.startTimeout, from the snapshot on disk.
func (a *Agent) startSyncing(ctx context.Context, g *parts, rebooted bool) {
	startLoop := func() {
		g.run("sync", func(ctx context.Context) error { a.runner.Loop(ctx); return nil })
		a.runner.Run()
	}
	offline := func() {
		startLoop()
		g.run("offline reconcile", func(ctx context.Context) error { a.reconcileAfterOffline(ctx); return nil })
	}
	synced := func() {
		a.log.Info("source synced; starting the sync loop")
		startLoop()
	}
	if rebooted {
		_ = a.notifier.Status("serving the last known state until the API server is listed")
		offline()
		return
	}
	if wait := a.Config().Offline.StartTimeout; a.api != nil && wait > 0 {
		wctx, wcancel := context.WithTimeout(ctx, wait)
		ok := a.source.WaitForSync(wctx)
		wcancel()
		switch {
		case ok:
			synced()
		case ctx.Err() == nil && a.startFromSnapshot("the API server is unreachable"):
			_ = a.notifier.Status("API server unreachable: serving the last known state")
			offline()
		case a.source.WaitForSync(ctx):
			synced()
		}
		return
	}
	if a.source.WaitForSync(ctx) {
		synced()
	}
}

// tamperCheckEvery is how often the monitor asks the backend whether its
// kernel objects were changed behind its back (kube-proxy's iptables mode
// looks at its canary chains once per sync period), and, when the backend
// announces writes, how soon after one it asks at most. A look costs one
// fingerprint read (nf_tables' generation, x_tables' counters) on a quiet
// node; the sentinel rules are checked only when it moved.
var tamperCheckEvery = 10 * time.Second // a variable for tests

// monitor asks the backend about tampering and forces a full sync when its
// kernel objects were changed behind its back. Its first look follows the
// first sync, so that the tables are verified (and the periodic compare
// can trust their fingerprint) from then on.
//
// A backend whose kernel announces writes (datapath.Watcher: iptables-nft)
// is asked only after one, on the next tick, so that a quiet node does not
// wake at all and a burst of writes costs one look; the others are polled
// every tick.
func (a *Agent) monitor(ctx context.Context, m datapath.Monitor) {
	select {
	case <-ctx.Done():
		return
	case <-a.synced:
	}
	written, polling := a.watchWrites(ctx, m)
	defer func() { <-polling }() // the watch ends with ctx
	// The first look waits until the watch is on (its first signal), so
	// that the look covers every write before it and the watch every one
	// after.
	select {
	case <-ctx.Done():
		return
	case <-written:
	case <-polling:
	}
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		bad, err := m.Tampered(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			a.log.Warn("cannot check the datapath for tampering", "err", err)
		case bad:
			a.log.Warn("datapath objects were changed outside edgeproxy; repairing with a full sync")
			a.metrics.tamperedRepairs.Inc()
			a.mu.Lock()
			a.needFull = true
			a.mu.Unlock()
			a.runner.Run()
		}
		select {
		case <-ctx.Done():
			return
		case <-written:
		case <-polling:
		}
		t.Reset(untilTick(time.Now(), tamperCheckEvery))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		select { // what was written while waiting, the next look covers
		case <-written:
		default:
		}
	}
}

// watchWrites starts the backend's watch of its kernel objects, if it has
// one, in a goroutine that ends with ctx: written hears of each write.
// polling is closed when there is no watch, or once it failed or ended:
// then the monitor looks every tick.
func (a *Agent) watchWrites(ctx context.Context, m datapath.Monitor) (written chan struct{}, polling chan struct{}) {
	written, polling = make(chan struct{}, 1), make(chan struct{})
	w, ok := m.(datapath.Watcher)
	if !ok {
		close(polling)
		return written, polling
	}
	go func() {
		defer close(polling)
		if err := w.WatchWrites(ctx, written); err != nil && !errors.Is(err, datapath.ErrNoWatch) && ctx.Err() == nil {
			a.log.Warn("cannot watch the datapath's kernel objects; polling them for tampering instead", "err", err)
		}
	}()
	return written, polling
}

// untilTick is the time from now to the next multiple of every on the
// wall clock, where the tamper monitor looks: writes that come close
// together are covered by one look.
func untilTick(now time.Time, every time.Duration) time.Duration {
	return now.Truncate(every).Add(every).Sub(now)
}

// reconfigure applies a reloaded config. The watcher has already kept the
// restart-only keys at their running values. The datapath takes its new
// settings (masquerading, the pod ranges, node-port addresses, the IPVS
// scheduler and timeouts…) and rewrites its rules with them at the next
// sync, which is a full one. When the new policy modules
// are refused, the rest applies, the running chains stay (and so does the
// policy part of the config shown in /debug/status), and the error makes
// the watcher count the reload as failed.
//
// New modules are read, compiled and checked beside the sync loop, which
// goes on with the running chains meanwhile: only the swap takes the sync
// lock, so no sync sees half of a reload, and the old chains are closed
// after it, once no evaluation uses them.
func (a *Agent) reconfigure(prev, next *config.Config) error {
	// The datapath first: a setting it refuses refuses the whole reload
	// before anything else changed.
	changed, err := reconfigureBackend(a.backend, prev, next, a.log)
	if err != nil {
		a.log.Error("datapath settings refused; the running config stays in force", "err", err)
		return fmt.Errorf("datapath: %w", err)
	}
	if changed {
		a.log.Info("datapath settings changed; the next sync rewrites the rules")
	}
	var perr error
	var swap *policychain.Swap
	// The agent's own chains reload; a policy the caller supplied does not.
	if a.chains != nil && !reflect.DeepEqual(prev.Policy, next.Policy) {
		swap, perr = a.chains.Prepare(context.Background(), next.Policy)
		if perr != nil {
			a.log.Error("policy reload failed; the running chains stay in force", "err", perr)
			kept := *next
			kept.Policy = prev.Policy
			next = &kept
		}
	}
	a.cfg.Store(next)
	if a.opts.LogLevel != nil {
		var l slog.Level
		if err := l.UnmarshalText([]byte(next.Log.Level)); err == nil {
			a.opts.LogLevel.Set(l)
		}
	}
	if prev.Sync != next.Sync {
		a.runner.SetIntervals(next.Sync.MinPeriod, next.Sync.MinPeriod, next.Sync.Period)
	}
	if prev.Memory != next.Memory {
		setMemoryLimit(next.Memory, a.log)
	}
	if prev.Conntrack != next.Conntrack && next.Mode != config.ModePlan {
		applyConntrack(next.Conntrack, a.log)
	}
	a.mu.Lock()
	a.planner.SetOptions(planner.Options{ExternalIPs: next.ExternalIPs})
	a.needFull = true
	if swap != nil {
		swap.Commit()
	}
	if perr == nil {
		a.planner.Invalidate()
	}
	a.mu.Unlock()
	if swap != nil {
		swap.Done(context.Background())
	}
	a.log.Info("config reloaded", "changed", config.Diff(prev, next))
	a.runner.Run()
	if perr != nil {
		return fmt.Errorf("policy: %w", perr)
	}
	return nil
}

func (a *Agent) apiContactSeconds() float64 {
	if a.api == nil {
		return 0
	}
	t := a.api.LastContact()
	if t.IsZero() {
		return -1
	}
	return time.Since(t).Seconds()
}

// parsePrefixes parses CIDRs from the config (already validated).
func parsePrefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}
