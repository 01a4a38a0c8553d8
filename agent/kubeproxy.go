package agent

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/datapath/ipvs"
	"github.com/edgeproxy/edgeproxy/datapath/kubeproxy"
)

// KubeProxyStatus is what the agent found of kube-proxy's kernel objects
// on this node and what it did with them (/debug/status).
type KubeProxyStatus struct {
	// Found is what kube-proxy had left when the agent first looked,
	// after its own first sync.
	Found kubeproxy.Report `json:"found,omitempty"`
	// Removed is what the agent removed; empty with keepKubeProxy.
	Removed   kubeproxy.Report `json:"removed,omitempty"`
	RemovedAt time.Time        `json:"removedAt,omitzero"`
	// Kept: keepKubeProxy is set, Found stays for inspection.
	Kept bool `json:"kept,omitempty"`
	// Returned is what kube-proxy wrote again after the removal: it is
	// still running. The agent leaves it alone.
	Returned   kubeproxy.Report `json:"returned,omitempty"`
	ReturnedAt time.Time        `json:"returnedAt,omitzero"`
	Error      string           `json:"error,omitempty"`
}

// kubeProxyTakeover owns the takeover's status and metrics.
type kubeProxyTakeover struct {
	mu      sync.Mutex
	status  *KubeProxyStatus // nil until the first look
	removed *prometheus.CounterVec
	found   prometheus.Gauge
}

func newKubeProxyTakeover(reg prometheus.Registerer) *kubeProxyTakeover {
	k := &kubeProxyTakeover{
		removed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgeproxy_kube_proxy_removed_total",
			Help: "kube-proxy's kernel objects removed after the first sync, by kind: chain (iptables chains and nftables chains), jump (rules of built-in chains jumping to them), virtual_server (its IPVS virtual servers), link (kube-ipvs0) and ipset.",
		}, []string{"kind"}),
		found: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgeproxy_kube_proxy_chains",
			Help: "kube-proxy's chains (iptables and nftables) in the kernel at the last look: kept (keepKubeProxy), or written again by a kube-proxy that still runs.",
		}),
	}
	for _, c := range []prometheus.Collector{k.removed, k.found} {
		_ = reg.Register(c)
	}
	return k
}

// Status returns a copy of the takeover's status, nil before the first look.
func (k *kubeProxyTakeover) Status() *KubeProxyStatus {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.status == nil {
		return nil
	}
	s := *k.status
	return &s
}

// kubeProxyRecheck are the delays after the removal at which the agent
// looks whether kube-proxy wrote its objects again (it still runs). The
// looks are few and end: a kube-proxy that comes back is reported, never
// fought.
var kubeProxyRecheck = []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 8 * time.Minute, 15 * time.Minute, 30 * time.Minute, time.Hour}

// takeOverFromKubeProxy waits for the first successful sync, so that the
// agent's rules are in place, then removes what kube-proxy left (unless
// keepKubeProxy), and looks a few times afterwards whether a kube-proxy
// that still runs wrote it again.
func (a *Agent) takeOverFromKubeProxy(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-a.synced:
	}
	cfg := a.Config()
	// Another mode's rules first: like kube-proxy's, they may still have
	// answered until now.
	stale := cleanupOtherModeAfterSync(ctx, cfg, a.log)
	o := kubeproxy.Options{Wait: cfg.IPTables.LockWait, Logger: a.log, Link: cfg.IPVS.Interface}
	// IPVS mode adopted kube-proxy's virtual servers of the keys it
	// programs: those stay.
	if p, ok := a.backend.(interface{ Programs(ipvs.Key) bool }); ok {
		o.Keep = p.Programs
	}
	k := a.kubeProxy
	st := &KubeProxyStatus{Kept: cfg.KeepKubeProxy}
	if cfg.KeepKubeProxy {
		found, err := kubeproxy.Find(ctx, o)
		st.Found = found
		if err != nil {
			a.log.Warn("looking for kube-proxy's rules", "err", err)
			st.Error = err.Error()
		}
		if len(found) > 0 {
			a.log.Warn("kube-proxy's rules are still in the kernel and are kept (keepKubeProxy): they answer what edgeproxy does not program; remove them with `kube-proxy --cleanup` or by restarting without keepKubeProxy",
				"found", found.String())
			k.found.Set(float64(found.Chains()))
		}
	} else {
		// Remove reports what it found and removed: no separate look
		// (each costs a run of iptables-save per backend and family).
		// Syncs wait while kube-proxy's objects go: no sync adopts a
		// virtual server between o.Keep's answer and its removal.
		a.mu.Lock()
		removed, err := kubeproxy.Remove(ctx, o)
		a.mu.Unlock()
		st.Found = removed
		if err != nil {
			// What is left is found too.
			left, _ := kubeproxy.Find(ctx, o)
			st.Found = append(slices.Clip(removed), left...)
		}
		if len(removed) > 0 {
			st.Removed, st.RemovedAt = removed, time.Now()
			k.removed.WithLabelValues("chain").Add(float64(removed.Chains()))
			k.removed.WithLabelValues("jump").Add(float64(removed.Jumps()))
			k.removed.WithLabelValues("virtual_server").Add(float64(removed.Servers()))
			k.removed.WithLabelValues("link").Add(float64(removed.Links()))
			k.removed.WithLabelValues("ipset").Add(float64(removed.Sets()))
			stale = true
		}
		switch {
		case err != nil:
			a.log.Warn("removing kube-proxy's rules", "removed", removed.String(), "err", err)
			st.Error = err.Error()
		case len(removed) == 0:
			a.log.Debug("no kube-proxy rules on this node")
		default:
			a.log.Info("took over from kube-proxy: removed its rules after the first sync",
				"chains", removed.Chains(), "jumps", removed.Jumps(), "virtualServers", removed.Servers(),
				"links", removed.Links(), "ipsets", removed.Sets(), "removed", removed.String())
		}
	}
	if stale {
		// Until now kube-proxy's rules (or another mode's) still answered
		// some new connections (nftables: its table's hooks may come
		// first), with endpoints of when it stopped; the UDP conntrack
		// entries they made outlive them. A full sync sweeps every UDP
		// entry whose endpoint is not in the plan, as the first one did.
		// A sync holds a.mu throughout: the next lastFull is that of a
		// sync that started after this.
		a.mu.Lock()
		a.needFull = true
		last := a.lastFull
		a.mu.Unlock()
		a.runner.Run()
		a.waitFullSyncAfter(ctx, last, time.Minute)
	}
	k.mu.Lock()
	k.status = st
	k.mu.Unlock()
	if len(st.Removed) == 0 {
		return
	}
	for _, d := range kubeProxyRecheck {
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		again, err := kubeproxy.Find(ctx, o)
		if err != nil || again.Chains() == 0 {
			continue
		}
		k.found.Set(float64(again.Chains()))
		k.mu.Lock()
		k.status.Returned, k.status.ReturnedAt = again, time.Now()
		k.mu.Unlock()
		a.log.Warn("kube-proxy wrote its rules again: it still runs on this node; edgeproxy leaves them. Stop kube-proxy (systemctl disable --now kube-proxy, or delete its DaemonSet), then restart edgeproxy to remove them",
			"found", again.String())
		return
	}
}

// waitFullSyncAfter waits, at most for d, until a full sync newer than
// the one that ended at last has applied: the status then tells of a
// takeover whose sweep is done.
func (a *Agent) waitFullSyncAfter(ctx context.Context, last time.Time, d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		a.mu.Lock()
		done := !a.lastFull.Equal(last)
		a.mu.Unlock()
		if done {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	a.log.Warn("the full sync after the takeover from kube-proxy has not run yet", "waited", d)
}

// takesOver reports whether the agent looks for kube-proxy's objects (and,
// with nftables mode, for another mode's): a kernel mode on the real
// kernel (not a test's backend, not `plan`).
func takesOver(cfg *config.Config, own bool) bool {
	return own && (cfg.Mode == config.ModeIPTables || cfg.Mode == config.ModeIPVS || cfg.Mode == config.ModeNFTables)
}
