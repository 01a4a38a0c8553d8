package config

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
)

// RestartOnly lists the keys a running agent cannot change: the identity
// and source it watches with (nodeName, kubeconfig, manifests, proxyName),
// the datapath it owns (mode, ipvs.interface), what it opened at start
// (stateDir, the server listeners, the Wasm engine) and the log handler's
// format. A reload that changes one of them reports it as "needs restart"
// and keeps the running value; all other keys take effect.
var RestartOnly = []string{
	"nodeName", "kubeconfig", "manifests", "mode", "proxyName", "stateDir",
	"server.healthz", "server.metrics", "policy.engine", "ipvs.interface",
	"log.format", "keepKubeProxy",
	// The datapath tells pods as it was built to, and opened its tools
	// with the lock wait; its other settings apply live (Reconfigure).
	"detectLocalMode", "detectLocal.bridgeInterface", "detectLocal.interfaceNamePrefix",
	"iptables.lockWait",
	// The prober is built once; health.mode and health.after apply live.
	"health.interval", "health.timeout", "health.failureThreshold", "health.successThreshold",
	"health.probesPerSecond", "health.concurrency", "health.jitterPercent", "health.perEndpointMetrics",
}

// DefaultDebounce is how long Watcher waits after the last file event
// before it reloads: editors and ConfigMap updates touch the file several
// times per save.
const DefaultDebounce = 200 * time.Millisecond

// WatcherOptions configures a Watcher.
type WatcherOptions struct {
	// Load is how each reload loads: the same options the initial Load
	// used, so env vars and flags keep overriding the file. Load.Path()
	// must name a file.
	Load LoadOptions
	// Registerer receives edgeproxy_config_reload_total{result} and
	// edgeproxy_config_restart_required; nil: not registered.
	Registerer prometheus.Registerer
	// Logger receives reload outcomes; nil: slog.Default().
	Logger *slog.Logger
	// Debounce overrides DefaultDebounce.
	Debounce time.Duration
	// OnChange, if set, is called after each swap with the previous and
	// the new effective config (never equal). Calls are serialised; it must
	// not call Reload. Current() already returns next when it runs.
	// An error means part of next could not be applied (e.g. its policy
	// modules were refused): the reload is counted as an error and the
	// watcher keeps prev as its base, so the next save retries.
	OnChange func(prev, next *Config) error
}

// Watcher keeps the current Config and replaces it when the file changes.
// Each reload loads and validates the file in full (Load); a bad file keeps
// the running config and is logged and counted. Keys in RestartOnly keep
// their running values. Create it with NewWatcher, then call Run.
type Watcher struct {
	opts     WatcherOptions
	path     string
	log      *slog.Logger
	cur      atomic.Pointer[Config]
	mu       sync.Mutex // serialises reloads
	pending  []string   // restart-only keys the file changes; under mu
	reloads  *prometheus.CounterVec
	restartG prometheus.Gauge
}

// NewWatcher returns a Watcher whose current config is initial (what Load
// returned for opts.Load). It registers its metrics; it starts nothing.
func NewWatcher(initial *Config, opts WatcherOptions) (*Watcher, error) {
	if initial == nil {
		return nil, errors.New("config: watcher: initial config is nil")
	}
	path := opts.Load.Path()
	if path == "" {
		return nil, errors.New("config: watcher: no config file to watch")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("config: watcher: %w", err)
	}
	if opts.Debounce <= 0 {
		opts.Debounce = DefaultDebounce
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	// The environment was read, and its unknown names warned about, by the
	// initial Load; it does not change, so reloads need not warn again.
	opts.Load.Logger = slog.New(slog.DiscardHandler)
	w := &Watcher{
		opts: opts,
		path: abs,
		log:  log.With("file", abs),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeproxy_config_reload_total",
			Help: "Config file reloads, by result (success: the file was valid and is in use; error: it was rejected, or applied only in part, and the previous config kept; empty: an empty file, usually a save caught half-way, ignored).",
		}, []string{"result"}),
		restartG: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeproxy_config_restart_required",
			Help: "1 when the config file changes a key that only takes effect after a restart (see the log for which), else 0.",
		}),
	}
	w.reloads.WithLabelValues("success")
	w.reloads.WithLabelValues("error")
	if r := opts.Registerer; r != nil {
		for _, c := range []prometheus.Collector{w.reloads, w.restartG} {
			if err := r.Register(c); err != nil {
				return nil, fmt.Errorf("config: watcher: register metrics: %w", err)
			}
		}
	}
	w.cur.Store(initial)
	return w, nil
}

// Current returns the config in effect. Treat it as read-only: it is
// shared.
func (w *Watcher) Current() *Config { return w.cur.Load() }

// RestartRequired returns the RestartOnly keys whose value in the file
// differs from the running one, as of the last successful reload.
func (w *Watcher) RestartRequired() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.pending)
}

// Reload loads the file now (e.g. on SIGHUP) and applies it as a file
// event would. It returns the load error when the file was rejected.
func (w *Watcher) Reload() error { return w.reload("requested", true) }

// Run watches the file's directory until ctx is done, then returns nil; it
// returns an error only when the watch cannot be set up. Call it once.
// Watching the directory rather than the file sees editors that write a new
// file and rename it over the old one, and Kubernetes ConfigMap volumes,
// which swap a "..data" symlink. When the path is a symlink, the directory
// of its target is watched too (and followed when the link changes). Bursts
// of events are debounced: the reload
// runs once the file has been quiet for Debounce, or at the latest
// 10×Debounce after the first event of the burst. Right after the watch is
// in place Run reloads once, so an edit made before Run is not missed.
func (w *Watcher) Run(ctx context.Context) error {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("config: watcher: %w", err)
	}
	defer fw.Close()
	dir := filepath.Dir(w.path)
	if err := fw.Add(dir); err != nil {
		return fmt.Errorf("config: watcher: watch %s: %w", dir, err)
	}
	// When the path is a symlink into another directory, watch that one
	// too, so edits at the target are seen; follow it when the link moves.
	target, targetDir := "", ""
	follow := func() {
		target = w.realPath()
		td := filepath.Dir(target)
		if target == "" || td == dir || td == targetDir {
			return
		}
		if targetDir != "" {
			_ = fw.Remove(targetDir) // may already be gone with its directory
		}
		targetDir = ""
		if err := fw.Add(td); err != nil {
			w.log.Warn("config: cannot watch the directory the config file links to", "dir", td, "err", err)
			return
		}
		targetDir = td
	}
	follow()
	_ = w.reload("watch started", false)

	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var fire <-chan time.Time
	var burstStart time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-fw.Events:
			if !ok {
				return nil
			}
			if ev.Op == fsnotify.Chmod {
				continue
			}
			base := filepath.Base(ev.Name)
			prev := target
			follow()
			if base == filepath.Base(w.path) || base == "..data" || ev.Name == target || target != prev {
				if fire == nil {
					burstStart = time.Now()
				}
				wait := min(w.opts.Debounce, time.Until(burstStart.Add(10*w.opts.Debounce)))
				timer.Reset(max(wait, 0))
				fire = timer.C
			}
		case err, ok := <-fw.Errors:
			if !ok {
				return nil
			}
			w.log.Warn("config: file watch error", "err", err)
		case <-fire:
			fire = nil
			_ = w.reload("file changed", true)
		}
	}
}

// realPath resolves symlinks in the watched path; "" when it does not
// resolve (e.g. in the middle of a swap).
func (w *Watcher) realPath() string {
	p, err := filepath.EvalSymlinks(w.path)
	if err != nil {
		return ""
	}
	return p
}

// reload loads the file and swaps the result in. With always false a
// reload that changes nothing is not counted or logged (the catch-up at the
// start of Run).
func (w *Watcher) reload(reason string, always bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	lo := w.opts.Load
	lo.RefuseEmpty = true
	next, err := Load(lo)
	if errors.Is(err, ErrEmpty) {
		// Usually an editor's save caught half-way (truncate, then
		// write): refused, and the write that follows is reloaded.
		w.log.Warn("config: the file is empty; keeping the running config", "reason", reason)
		w.reloads.WithLabelValues("empty").Inc()
		return err
	}
	if err != nil {
		// Log before counting: whoever watches the counter finds the reason.
		w.log.Error("config: reload rejected; keeping the running config", "reason", reason, "err", err)
		w.reloads.WithLabelValues("error").Inc()
		return err
	}
	prev := w.cur.Load()
	held := keepRestartOnly(next, prev)
	pending := make([]string, len(held))
	for i, h := range held {
		pending[i] = h.key
	}
	changed := Diff(prev, next)
	if len(changed) == 0 && slices.Equal(pending, w.pending) && !always {
		return nil
	}
	w.pending = pending
	if len(pending) > 0 {
		w.restartG.Set(1)
	} else {
		w.restartG.Set(0)
	}
	for _, h := range held {
		w.log.Warn("config: key needs a restart to take effect; keeping the running value",
			"key", h.key, "running", h.running, "file", h.file)
	}
	if len(changed) == 0 {
		w.reloads.WithLabelValues("success").Inc()
		w.log.Info("config: reloaded, nothing changed", "reason", reason)
		return nil
	}
	w.cur.Store(next)
	if w.opts.OnChange != nil {
		if err := w.opts.OnChange(prev, next); err != nil {
			w.cur.Store(prev)
			w.log.Error("config: reload applied only in part", "reason", reason, "changed", changed, "err", err)
			w.reloads.WithLabelValues("error").Inc()
			return err
		}
	}
	w.reloads.WithLabelValues("success").Inc()
	w.log.Info("config: reloaded", "reason", reason, "changed", changed)
	return nil
}

// heldKey is a RestartOnly key whose file value was not applied.
type heldKey struct {
	key           string
	running, file any
}

// keepRestartOnly copies the RestartOnly keys from running into next and
// returns those where next wanted something else.
func keepRestartOnly(next, running *Config) []heldKey {
	var held []heldKey
	for _, key := range RestartOnly {
		nv, ok1 := lookup(next, key)
		rv, ok2 := lookup(running, key)
		if !ok1 || !ok2 {
			panic("config: RestartOnly names unknown key " + key)
		}
		if !reflect.DeepEqual(nv.Interface(), rv.Interface()) {
			held = append(held, heldKey{key: key, running: rv.Interface(), file: nv.Interface()})
			nv.Set(rv)
		}
	}
	return held
}

// lookup returns the field of c that a schema leaf key names.
func lookup(c *Config, key string) (reflect.Value, bool) {
	for _, l := range schema.leaves {
		if l.key == key {
			return reflectValue(c).FieldByIndex(l.index), true
		}
	}
	return reflect.Value{}, false
}

// Diff returns the dotted keys whose values differ between a and b, in
// schema order; lists of modules and chains are compared whole and named
// as "policy.modules" and "policy.chains".
func Diff(a, b *Config) []string {
	var out []string
	var walk func(prefix string, x, y reflect.Value)
	walk = func(prefix string, x, y reflect.Value) {
		t := x.Type()
		for i := range t.NumField() {
			tag := t.Field(i).Tag.Get("koanf")
			if tag == "" || tag == "-" {
				continue
			}
			key := join(prefix, tag)
			fx, fy := x.Field(i), y.Field(i)
			if fx.Kind() == reflect.Struct {
				walk(key, fx, fy)
				continue
			}
			if !reflect.DeepEqual(fx.Interface(), fy.Interface()) {
				out = append(out, key)
			}
		}
	}
	walk("", reflectValue(a), reflectValue(b))
	return out
}
