// Package iptables is the iptables datapath: it programs a datapath.Plan as
// plain iptables chains (see datapath/README.md for the packet path). Rule
// text is rendered by pure functions (Render) and written atomically with
// iptables-restore --noflush; only the jumps from the built-in chains are
// managed rule by rule, through go-iptables.
package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goipt "github.com/coreos/go-iptables/iptables"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/conntrack"
	"github.com/edgeproxy/edgeproxy/datapath/sysctl"
	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// Variant is an iptables backend (see datapath/xtables, which drives the
// tools for both datapaths).
type Variant = xtables.Variant

const (
	Auto   = xtables.Auto   // whatever "iptables" resolves to
	Legacy = xtables.Legacy // iptables-legacy: x_tables
	NFT    = xtables.NFT    // iptables-nft: nf_tables with the xtables compat layer
)

// ErrBothBackends is returned by New when edgeproxy chains exist under both
// iptables-legacy and iptables-nft: packets would traverse both sets.
var ErrBothBackends = xtables.ErrBothBackends

// ErrNoWatch is wrapped by WatchWrites on iptables-legacy: x_tables
// announces no writes.
var ErrNoWatch = datapath.ErrNoWatch

// ConntrackCleaner removes stale UDP conntrack entries after an apply.
// *conntrack.Cleaner implements it.
type ConntrackCleaner interface {
	Reconcile(ctx context.Context, frontends []datapath.Frontend, force bool) (int, error)
}

// Options configure a Proxier.
type Options struct {
	// MasqueradeBit is the packet-mark bit (0..31) that asks for SNAT.
	// kube-proxy and edgeproxy's config default to 14.
	MasqueradeBit int
	// LocalhostNodePorts lets NodePorts answer on 127.0.0.0/8 (sets
	// route_localnet).
	LocalhostNodePorts bool
	// ClusterCIDRs are the pod ranges, at most one per family: how
	// traffic from pods is told (Config.ClusterCIDRs); sources outside
	// them are masqueraded when they reach a ClusterIP.
	ClusterCIDRs []netip.Prefix
	// NodePodCIDRs tells pods by the plan's PodCIDRs (the Node's
	// spec.podCIDRs) instead of ClusterCIDRs, followed at every apply:
	// kube-proxy's detect-local-mode NodeCIDR. A family the Node has no
	// range of tells no traffic from pods.
	NodePodCIDRs bool
	// PodInterface tells pods by the interface their traffic arrives on
	// instead (Config.PodInterface): kube-proxy's BridgeInterface ("cni0")
	// and InterfaceNamePrefix ("veth+") modes.
	PodInterface string
	// MasqueradeAll masquerades all ClusterIP traffic.
	MasqueradeAll bool
	// NodePortAddresses restricts NodePorts to the node's own addresses
	// inside these prefixes, looked up at every apply. An IP family with
	// no prefix here (and no primary address, see NodePortPrimary) keeps
	// every local address of that family.
	NodePortAddresses []netip.Prefix
	// NodePortPrimary adds the plan's NodeIPs (the node's primary
	// addresses) to NodePortAddresses: kube-proxy's "primary" keyword.
	NodePortPrimary bool
	// LockWait bounds the wait for the xtables lock (default 5s).
	LockWait time.Duration
	// TCPBeLiberal: nf_conntrack_tcp_be_liberal is set, so out-of-window
	// packets are not dropped as INVALID (kube-proxy's rule is then left out).
	TCPBeLiberal bool
	// FullSyncPeriod is how often every rule is rewritten even when
	// nothing changed (default 1h, as kube-proxy). Plans with Full set in
	// between are compared in full but only differing chains rewritten;
	// after a failed apply or Tampered() reporting true the next apply
	// rewrites everything.
	FullSyncPeriod time.Duration
	Logger         *slog.Logger
	// Registerer receives the metrics; nil registers none.
	Registerer prometheus.Registerer

	// Variant selects the backend binaries; Auto uses "iptables".
	Variant Variant
	// IPv6 also programs IPv6 frontends with ip6tables. Off: IPv6
	// frontends are ignored.
	IPv6 bool
	// KeepIPv6Forwarding leaves net.ipv6.conf.all.forwarding alone;
	// otherwise IPv6 turns it on. Turning it on makes every interface
	// with accept_ra=1 ignore Router Advertisements and drops the
	// default routes they gave: the agent keeps it on a node that does
	// not route IPv6 yet (no global IPv6 address, no IPv6 clusterCIDR),
	// whose IPv6 may come by SLAAC, as it did before it proxied IPv6
	// there (pods with IPv6 mean the CNI turned forwarding on).
	KeepIPv6Forwarding bool
	// Sysctls are extra kernel parameters to set at start, e.g.
	// "net/netfilter/nf_conntrack_udp_timeout": "60".
	Sysctls map[string]string
	// Conntrack cleans UDP entries after each successful apply. Nil
	// creates a conntrack.Cleaner; set NoConntrack to have none.
	Conntrack   ConntrackCleaner
	NoConntrack bool
}

// Proxier implements datapath.Backend, datapath.Monitor and
// datapath.Watcher with iptables.
type Proxier struct {
	log  *slog.Logger
	opts Options
	ct   ConntrackCleaner
	fams []*family
	m    *metrics

	sysctlErr error

	mu        sync.Mutex
	lastCheck time.Time     // of the last tamper check
	checkCost time.Duration // how long it took

	watches atomic.Int32 // running WatchWrites (see tamper.go)
}

var (
	_ datapath.Backend = (*Proxier)(nil)
	_ datapath.Monitor = (*Proxier)(nil)
	_ datapath.Watcher = (*Proxier)(nil)
)

// family is the state of one IP family's rules.
type family struct {
	cfg Config
	x   *xtables.Tool   // the backend's tools: restore, save, listings
	io  tablesIO        // toolIO{f.x}, or a fake in unit tests
	ipt *goipt.IPTables // rule-by-rule edits of the jumps
	log *slog.Logger

	applied  bool // a plan was applied since start
	needFull bool // the last apply failed
	// units are the summaries of the units as last written (see
	// unit.summarize): their chains and digests, no rule text. Reused by
	// partial syncs for the units that did not change.
	units        map[unitID]*unit
	lastFixed    map[xtables.Chain]digest // digests of the fixed chains as written
	lastFixedSum digest                   // Ruleset.fixedSum as written
	lastRewrite  time.Time                // of the last full rewrite

	podCIDRsRead bool           // followPodCIDRs has run: the Node's range is in cfg
	npa          []netip.Prefix // nodePortAddresses of this family
	primary      bool           // plus the node's primary address

	// The tables' fingerprint when a full tamper check last passed.
	verified   bool
	verifiedFP uint64
	verifiedAt time.Time
	readFP     uint64 // read before the running full check
	readOK     bool
	fullChecks int // how many ran, for tests
}

// tablesIO is what a sync needs of the tables: restores and listings
// (iptables -t TABLE -S). toolIO implements it; unit tests use a fake.
type tablesIO interface {
	StartRestore(ctx context.Context) (restorer, error)
	Run(ctx context.Context, args ...string) (string, error)
}

// restorer is one running iptables-restore --noflush (*xtables.Restore):
// its input is written, then committed, or it is aborted and commits
// nothing.
type restorer interface {
	Write(p []byte) (int, error)
	Commit() (xtables.RestoreStats, error)
	Abort()
}

// toolIO is tablesIO on the real tools.
type toolIO struct{ *xtables.Tool }

func (t toolIO) StartRestore(ctx context.Context) (restorer, error) {
	return t.Tool.StartRestore(ctx)
}

// New detects the iptables backend, checks that our chains are not held by
// both backends, sets the sysctls the datapath needs and returns a Proxier.
// It changes no rules: the first Apply adopts whatever a previous run left.
func New(opts Options) (*Proxier, error) {
	if opts.MasqueradeBit < 0 || opts.MasqueradeBit > 31 {
		return nil, fmt.Errorf("iptables: masquerade bit %d out of range 0..31", opts.MasqueradeBit)
	}
	if opts.LockWait <= 0 {
		opts.LockWait = 5 * time.Second
	}
	if opts.FullSyncPeriod <= 0 {
		opts.FullSyncPeriod = time.Hour
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	p := &Proxier{log: log, opts: opts}

	fams := []datapath.Family{datapath.IPv4}
	if opts.IPv6 {
		fams = append(fams, datapath.IPv6)
	}
	for _, fam := range fams {
		f, err := newFamily(opts, fam, log)
		if err != nil {
			return nil, err
		}
		p.fams = append(p.fams, f)
	}

	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	p.m = m

	switch {
	case opts.NoConntrack:
	case opts.Conntrack != nil:
		p.ct = opts.Conntrack
	default:
		c, err := conntrack.New(conntrack.Options{Logger: opts.Logger, Registerer: opts.Registerer, NodePortAddresses: opts.NodePortAddresses})
		if err != nil {
			return nil, fmt.Errorf("iptables: %w", err)
		}
		p.ct = c
	}

	if err := sysctl.Ensure(p.sysctls()); err != nil {
		p.sysctlErr = err
		log.Warn("cannot set the sysctls the datapath needs; some traffic may not be forwarded", "err", err)
	}
	return p, nil
}

// SysctlErrors returns the sysctls New could not set, joined, or nil.
func (p *Proxier) SysctlErrors() error { return p.sysctlErr }

// Name implements datapath.Backend.
func (p *Proxier) Name() string { return "iptables" }

// Variant reports the backend in use, as detected by New.
func (p *Proxier) Variant() Variant { return p.fams[0].x.Variant }

// openFamily opens the tools of variant v for fam (xtables.Open) and
// go-iptables on the same binary.
func openFamily(v Variant, fam datapath.Family, wait time.Duration, log *slog.Logger) (*family, error) {
	x, err := xtables.Open(v, fam, wait)
	if err != nil {
		return nil, fmt.Errorf("iptables: %w", err)
	}
	ipt, err := goipt.New(goipt.IPFamily(protoOf(fam)), goipt.Path(x.IPTables), goipt.Timeout(x.WaitSeconds()))
	if err != nil {
		return nil, fmt.Errorf("iptables: %s: %w", x.IPTables, err)
	}
	return &family{cfg: Config{Family: fam}, x: x, io: toolIO{x}, ipt: ipt, log: log.With("family", fmt.Sprintf("IPv%d", fam))}, nil
}

func newFamily(opts Options, fam datapath.Family, log *slog.Logger) (*family, error) {
	f, err := openFamily(opts.Variant, fam, opts.LockWait, log)
	if err != nil {
		return nil, err
	}
	// Refuse to run when both backends hold our chains.
	if err := f.x.CheckOtherBackend(context.Background(), xtables.NAT, chainServices, log); err != nil {
		return nil, err
	}
	f.cfg.RandomFully = f.ipt.HasRandomFully()
	f.configure(opts)
	log.Info("iptables backend detected", "family", fmt.Sprintf("IPv%d", fam), "variant", f.x.Variant, "iptables", f.x.IPTables, "restore", f.x.Restore)
	return f, nil
}

// configure takes the rendering settings of opts (New's, or
// Reconfigure's) for the family. What the kernel and the plans decide
// stays: the family, RandomFully, the node-port addresses and health
// check ports of the last apply, and with NodePodCIDRs the Node's range.
func (f *family) configure(opts Options) {
	fam := f.cfg.Family
	f.npa, f.primary = filterFamily(opts.NodePortAddresses, fam), opts.NodePortPrimary
	f.cfg.MasqueradeBit = opts.MasqueradeBit
	f.cfg.MasqueradeAll = opts.MasqueradeAll
	f.cfg.PodInterface = opts.PodInterface
	f.cfg.LocalhostNodePorts = opts.LocalhostNodePorts && fam == datapath.IPv4
	f.cfg.TCPBeLiberal = opts.TCPBeLiberal
	if !opts.NodePodCIDRs {
		f.cfg.ClusterCIDRs = filterFamily(opts.ClusterCIDRs, fam)
	} // else the Node's, from the first plan on (followPodCIDRs)
}

// Reconfigure takes the settings of opts that can change while the
// proxier runs and makes the next Apply a rewrite, rendered with them:
// MasqueradeBit, MasqueradeAll, ClusterCIDRs, NodePortAddresses,
// NodePortPrimary, LocalhostNodePorts, TCPBeLiberal, KeepIPv6Forwarding
// and Sysctls (set now, as by New; a sysctl already set is not undone).
// The others keep the values New was given: they chose the tools, the
// families and how pods are told (Variant, IPv6, LockWait,
// NodePodCIDRs, PodInterface), and who logs and counts. A bad value
// changes nothing.
func (p *Proxier) Reconfigure(opts Options) error {
	if opts.MasqueradeBit < 0 || opts.MasqueradeBit > 31 {
		return fmt.Errorf("iptables: masquerade bit %d out of range 0..31", opts.MasqueradeBit)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	o := &p.opts
	o.MasqueradeBit, o.MasqueradeAll, o.ClusterCIDRs = opts.MasqueradeBit, opts.MasqueradeAll, opts.ClusterCIDRs
	o.NodePortAddresses, o.NodePortPrimary = opts.NodePortAddresses, opts.NodePortPrimary
	o.LocalhostNodePorts, o.TCPBeLiberal = opts.LocalhostNodePorts, opts.TCPBeLiberal
	o.KeepIPv6Forwarding, o.Sysctls = opts.KeepIPv6Forwarding, opts.Sysctls
	for _, f := range p.fams {
		f.configure(p.opts)
		f.needFull = true
	}
	if c, ok := p.ct.(interface{ SetNodePortAddresses([]netip.Prefix) }); ok {
		c.SetNodePortAddresses(o.NodePortAddresses)
	}
	if err := sysctl.Ensure(p.sysctls()); err != nil {
		p.sysctlErr = err
		p.log.Warn("cannot set the sysctls the datapath needs; some traffic may not be forwarded", "err", err)
	}
	return nil
}

// sysctls are the kernel parameters the options need.
func (p *Proxier) sysctls() map[string]string {
	want := map[string]string{"net/ipv4/ip_forward": "1"}
	if p.opts.LocalhostNodePorts {
		want["net/ipv4/conf/all/route_localnet"] = "1"
	}
	if p.opts.IPv6 && !p.opts.KeepIPv6Forwarding {
		want["net/ipv6/conf/all/forwarding"] = "1"
	}
	maps.Copy(want, p.opts.Sysctls)
	return want
}

// followPodCIDRs makes the Node's pod range of the family (its first, as
// kube-proxy takes it) the one that tells pods. A change renders every
// unit again: the fixed chains change with it (see family.ruleset).
func (f *family) followPodCIDRs(podCIDRs []netip.Prefix) {
	cidrs := filterFamily(podCIDRs, f.cfg.Family)
	if len(cidrs) > 1 {
		cidrs = cidrs[:1]
	}
	if f.podCIDRsRead && slices.Equal(cidrs, f.cfg.ClusterCIDRs) {
		return
	}
	f.podCIDRsRead = true
	if len(cidrs) == 0 {
		f.log.Warn("detectLocalMode NodeCIDR: the Node has no pod range of this family; no traffic is told from pods", "podCIDRs", podCIDRs)
	} else {
		f.log.Info("detectLocalMode NodeCIDR: pods are told by the Node's pod range", "podCIDR", cidrs[0])
	}
	f.cfg.ClusterCIDRs = cidrs
}

func protoOf(f datapath.Family) goipt.Protocol {
	if f == datapath.IPv6 {
		return goipt.ProtocolIPv6
	}
	return goipt.ProtocolIPv4
}

func filterFamily(ps []netip.Prefix, fam datapath.Family) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if datapath.FamilyOf(p.Addr()) == fam {
			out = append(out, p)
		}
	}
	return out
}

// Apply implements datapath.Backend. Normally only the chains whose
// rendered rules differ from what was last written are written, and chains
// no longer wanted are deleted, in one atomic iptables-restore. Everything
// is rewritten on the first apply since New, after a failed apply, after
// tampering was seen, and once per FullSyncPeriod; plan.Full otherwise
// asks for a compare (see syncMode). A service port whose rules the
// kernel refuses is left out and named in the error; the others are
// programmed. After a successful apply, stale UDP conntrack entries are
// deleted.
func (p *Proxier) Apply(ctx context.Context, plan *datapath.Plan) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	ok := true
	// One family after the other, from the calling goroutine: the tools
	// run in its thread's network namespace (a goroutine of its own may
	// run on a thread in another), and iptables-legacy's families share
	// one lock, which a restore that finds taken retries a second later.
	for _, f := range p.fams {
		fatal, err := p.applyFamily(ctx, f, plan)
		if err != nil {
			errs = append(errs, err)
		}
		ok = ok && !fatal
	}
	// A failed conntrack cleanup does not fail the apply: the rules are
	// right, the cleaner counts the failure, and the next sync tries again.
	if ok && p.ct != nil {
		if _, err := p.ct.Reconcile(ctx, plan.Frontends, plan.Full); err != nil {
			p.log.Warn("conntrack cleanup after the apply failed; retried next sync", "err", err)
		}
	}
	return errors.Join(errs...)
}

// applyFamily applies plan to one family's tables and records it in the
// metrics; fatal is a failure that left the family's rules unwritten.
func (p *Proxier) applyFamily(ctx context.Context, f *family, plan *datapath.Plan) (fatal bool, err error) {
	// plan.Full asks for a compare: the sentinel rules are checked unless
	// the tables' fingerprint shows no write since they last passed (a
	// flush found there turns it into a rewrite), and every unit whose
	// input moved is rendered again without trusting plan.Changed.
	mode := decideMode(modeInput{
		applied:    f.applied,
		owed:       f.needFull,
		rewriteDue: time.Since(f.lastRewrite) >= p.opts.FullSyncPeriod,
		compare:    plan.Full,
	}, func() bool {
		if f.unchanged(p.watched()) {
			return false
		}
		t, err := f.tampered(ctx)
		return err != nil || t
	})
	if ips, err := datapath.NodePortIPs(f.cfg.Family, f.npa, f.primary, plan.NodeIPs, localAddrs); err != nil {
		f.log.Warn("cannot list the node's addresses; node ports keep the addresses they had", "err", err)
	} else {
		f.cfg.NodePortIPs = ips
	}
	f.cfg.HealthCheckPorts = plan.HealthCheckPorts
	if p.opts.NodePodCIDRs && p.opts.PodInterface == "" {
		f.followPodCIDRs(plan.PodCIDRs)
	}
	start := time.Now()
	pre, read, trusted := f.verifiedNow()
	st, err := f.apply(ctx, plan, mode)
	switch {
	case err == nil && mode == modeRewrite && read && f.trustRewrite(pre):
	case err == nil && trusted:
		f.trustOwnWrite(pre)
	}
	if mode == modeRewrite {
		p.m.fullDuration.Observe(time.Since(start).Seconds())
	} else {
		p.m.partialDuration.Observe(time.Since(start).Seconds())
	}
	p.m.restoreFailures.Add(float64(st.failures))
	if mode != modeRewrite {
		p.m.partialFailures.Add(float64(st.failures))
	}
	if st.bytes > 0 {
		p.m.restoreBytes.Set(float64(st.bytes))
	}
	for t, n := range st.rules {
		p.m.rules.WithLabelValues(t).Set(float64(n))
	}
	// Where the time went: a restore's wall time against its own CPU time
	// tells a busy machine (the restore waited for a core) from a larger
	// write.
	f.log.Debug("applied plan", "generation", plan.Generation, "mode", mode, "written", st.written, "units", st.units, "bytes", st.bytes,
		"took", time.Since(start), "render", st.render, "restore", st.restore.Wall, "restoreCPU", st.restore.CPU)
	return err != nil && st.fatal, err
}

// Unchanged reports whether every family's tables are as the last apply
// left them, as far as a cheap look tells: a plan was applied and did not
// fail, the tables' fingerprint is the one the tamper monitor last
// verified (moved since only by our own applies), no periodic rewrite is
// due, and no node port follows the node's addresses (those are read at
// every apply). The agent then skips the periodic compare of a quiet node.
func (p *Proxier) Unchanged() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range p.fams {
		if !f.applied || f.needFull || len(f.npa) > 0 || f.primary || time.Since(f.lastRewrite) >= p.opts.FullSyncPeriod {
			return false
		}
		if _, _, ok := f.verifiedNow(); !ok {
			return false
		}
	}
	return true
}

type applyStats struct {
	units, written, bytes int
	failures              int
	fatal                 bool
	rules                 map[string]int
	render                time.Duration        // rendering the rules and the restore input
	restore               xtables.RestoreStats // of the last restore
}

// emptyRestore is the restore input of a partial sync that changes nothing.
var emptyRestore = []byte("*filter\nCOMMIT\n*nat\nCOMMIT\n")

// apply writes plan in mode and remembers what it wrote.
func (f *family) apply(ctx context.Context, plan *datapath.Plan, mode syncMode) (applyStats, error) {
	var st applyStats
	existing, missing, listed, err := f.existingChains(mode)
	if err != nil {
		f.needFull = true
		st.fatal = true
		return st, err
	}
	w, err := f.write(ctx, &st, plan, mode, existing, missing)
	errs := w.errs
	if err == nil && mode == modeRewrite && !listed {
		// A periodic rewrite: the jumps are checked one by one.
		err = f.ensureJumps()
	}
	if err != nil {
		f.needFull = true
		st.fatal = true
		return st, errors.Join(append(errs, err)...)
	}
	st.units = len(w.rs.units)
	if w.spec.write == nil {
		st.written = len(w.rs.units)
	} else {
		st.written = len(w.spec.write)
	}
	f.remember(w.rs, w.fixed, mode)
	st.rules = w.rs.ruleCounts()
	return st, errors.Join(errs...)
}

// written is what one restore wrote: the ruleset rendered, which of its
// chains were written (spec), the fixed chains' digests as written, and
// the units left out because the tables refused them (PortErrors).
type written struct {
	rs    *Ruleset
	spec  writeSpec
	fixed map[xtables.Chain]digest
	errs  []error
}

// write renders the plan and writes it in one restore. When the restore
// fails on a unit's line, that unit is left out (its error in errs) and
// the rest written again; err is a failure no unit is to blame for, or
// the last one after maxRounds.
func (f *family) write(ctx context.Context, st *applyStats, plan *datapath.Plan, mode syncMode, existing []xtables.Chain, missing []xtables.Jump) (w written, err error) {
	// Each round either succeeds or drops the unit that a failed line
	// belongs to; the bound keeps a systematic failure from looping.
	const maxRounds = 8
	dropped := map[unitID]bool{}
	// A rewrite always writes: its iptables-restore starts before the
	// render, so that the process's start-up overlaps with it. Its input
	// is written only once it is rendered whole and its objects have
	// passed their checks; a render refused before that aborts it, and
	// the kernel keeps the rules it has.
	var rr restorer
	if mode == modeRewrite {
		rr, _ = f.io.StartRestore(ctx) // on failure, started again below and reported there
	}
	defer func() {
		if rr != nil {
			rr.Abort()
		}
	}()
	for round := 0; ; round++ {
		var keepFixed bool
		began := time.Now()
		w.rs, keepFixed = f.ruleset(plan, mode, dropped)
		if round == 0 {
			w.errs = w.rs.Errors
		}
		w.spec = f.writeSpec(w.rs, w.rs.chains(), existing, missing, mode)
		w.spec.keepFixed = keepFixed
		var text []byte
		var owner []*unitID
		text, owner, w.fixed, err = w.rs.restoreText(w.spec)
		st.bytes, st.render = len(text), time.Since(began)
		if err == nil {
			if mode != modeRewrite && len(w.spec.write) == 0 && len(w.spec.stale) == 0 && bytes.Equal(text, emptyRestore) {
				return w, nil // nothing changed
			}
			st.restore, err = f.restore(ctx, &rr, text)
		}
		if err == nil {
			return w, nil
		}
		st.failures++
		id := xtables.FailedOwner(err, owner)
		if id == nil || round == maxRounds-1 {
			return w, err
		}
		var oe *xtables.OpError[*unitID]
		if !errors.As(err, &oe) { // an OpError names its unit already
			err = fmt.Errorf("iptables: unit %s: %w", id, err)
		}
		w.errs = append(w.errs, &datapath.PortError{Service: id.service, Err: err})
		dropped[*id] = true
	}
}

// ruleset renders the plan, reusing the units of the last sync that did
// not change (see reuse) and leaving out the dropped ones. keepFixed says
// the fixed chains are as last written; when they are not, units taken
// from the last sync are rendered again, as the fixed chains hold rules
// of every unit.
func (f *family) ruleset(plan *datapath.Plan, mode syncMode, dropped map[unitID]bool) (rs *Ruleset, keepFixed bool) {
	rs = render(f.cfg, plan.Frontends, f.reuse(plan, mode))
	rs.dropAll(dropped)
	keepFixed = mode != modeRewrite && rs.fixedSum() == f.lastFixedSum
	if !keepFixed && rs.summaries() {
		rs = render(f.cfg, plan.Frontends, nil)
		rs.dropAll(dropped)
	}
	return rs, keepFixed
}

// reuse returns how render takes units from the last apply: those of
// service ports the plan says did not change are not rendered again but
// taken as the summaries kept (see family.ruleset for when they are
// rendered after all). A compare does not trust plan.Changed: it takes a
// summary only when the unit's input hash (its frontends and the
// rendering config) is the one it was rendered from, and renders the
// others. Nil (render everything) on a rewrite.
func (f *family) reuse(plan *datapath.Plan, mode syncMode) reuseFunc {
	switch {
	case mode == modeRewrite || len(f.units) == 0:
		return nil
	case mode == modeCompare || plan.Changed == nil:
		return func(id unitID, in func() inputSum) *unit {
			if last := f.units[id]; last != nil && last.input == in() {
				return last
			}
			return nil
		}
	}
	return func(id unitID, _ func() inputSum) *unit {
		if plan.Changed[id.service] {
			return nil
		}
		return f.units[id]
	}
}

// existingChains returns, for a rewrite, the chains of ours that exist
// (a rewrite removes those the plan does not want). What the kernel
// holds is listed on the first apply (adopting a previous run's chains)
// and after a failure, and then the missing jumps from built-in chains
// are known too: they are written in the same restore as the chains they
// lead to, so that rules are live the moment they are in the kernel.
// Otherwise what we wrote last is known, and listing a large table is
// costly.
func (f *family) existingChains(mode syncMode) (existing []xtables.Chain, missing []xtables.Jump, listed bool, err error) {
	switch {
	case mode == modeRewrite && (!f.applied || f.needFull):
		existing, missing, err = f.listOurs()
		return existing, missing, true, err
	case mode == modeRewrite:
		for _, u := range f.units {
			existing = append(existing, u.names...)
		}
	}
	return existing, nil, false, nil
}

// writeSpec says what one restore writes: on a rewrite everything, and
// the existing chains not desired are deleted; otherwise only units whose
// digest changed, fixed chains whose content changed, and deletions of
// the chains written last that are no longer desired.
func (f *family) writeSpec(rs *Ruleset, desired map[xtables.Chain]bool, existing []xtables.Chain, missing []xtables.Jump, mode syncMode) writeSpec {
	ws := writeSpec{jumps: missing}
	if mode == modeRewrite {
		for _, c := range existing {
			if !desired[c] && !isFixed(c) {
				ws.stale = append(ws.stale, c)
			}
		}
		return ws
	}
	ws.write = map[unitID]bool{}
	for _, u := range rs.units {
		if last, ok := f.units[u.id]; !ok || last.digest != u.digest {
			ws.write[u.id] = true
		}
	}
	for _, u := range f.units {
		for _, c := range u.names {
			if !desired[c] {
				ws.stale = append(ws.stale, c)
			}
		}
	}
	ws.fixed = f.lastFixed
	return ws
}

// remember records what a successful apply wrote, for the next one: unit
// summaries and digests, no rule text.
func (f *family) remember(rs *Ruleset, fixed map[xtables.Chain]digest, mode syncMode) {
	f.units = make(map[unitID]*unit, len(rs.units))
	for _, u := range rs.units {
		if !u.summary {
			u = u.summarize()
		}
		f.units[u.id] = u
	}
	f.lastFixed = fixed
	f.lastFixedSum = rs.fixedSum()
	if mode == modeRewrite {
		f.lastRewrite = time.Now()
	}
	f.applied = true
	f.needFull = false
}

func isFixed(c xtables.Chain) bool {
	for _, n := range fixedChains[c.Table] {
		if n == c.Name {
			return true
		}
	}
	return false
}

// ourChains lists the chains with our prefix in the tables we use.
func (f *family) ourChains() ([]xtables.Chain, error) {
	chains, _, err := f.listOurs()
	return chains, err
}

// listOurs lists, with one `iptables -S` per table, the chains with our
// prefix and the jumps from built-in chains (jumps()) that are missing.
func (f *family) listOurs() (chains []xtables.Chain, missing []xtables.Jump, err error) {
	rules := map[string]string{}
	for _, t := range []string{xtables.NAT, xtables.Filter} {
		out, err := f.io.Run(context.Background(), "-t", t, "-S")
		if err != nil {
			return nil, nil, fmt.Errorf("iptables: list the chains of %s: %w", t, err)
		}
		rules[t] = out
		for _, l := range strings.Split(out, "\n") {
			if name, ok := strings.CutPrefix(l, "-N "); ok && ours(name) {
				chains = append(chains, xtables.Chain{Table: t, Name: name})
			}
		}
	}
	for _, j := range jumps(f.cfg.Family) {
		if !hasRule(rules[j.Table], j) {
			missing = append(missing, j)
		}
	}
	for _, j := range obsoleteJumps() {
		if hasRule(rules[j.Table], j) {
			if err := f.ipt.DeleteIfExists(j.Table, j.Chain, j.Rule.Args()...); err != nil {
				return nil, nil, fmt.Errorf("iptables: delete obsolete jump %s/%s -> %s: %w", j.Table, j.Chain, j.To(), err)
			}
		}
	}
	return chains, missing, nil
}

// hasRule reports whether a listing (iptables -S or iptables-save) holds
// rule j: a rule in its chain that jumps to its target with its comment.
func hasRule(listing string, j xtables.Jump) bool {
	target := j.To()
	for _, l := range strings.Split(listing, "\n") {
		if strings.HasPrefix(l, "-A "+j.Chain+" ") && strings.HasSuffix(strings.TrimSpace(l), "-j "+target) && strings.Contains(l, j.Rule.Comment) {
			return true
		}
	}
	return false
}

// restore writes text with one iptables-restore --noflush: *rr when one
// was started (it is used up), else a new one.
func (f *family) restore(ctx context.Context, rr *restorer, text []byte) (xtables.RestoreStats, error) {
	r := *rr
	*rr = nil
	if r == nil {
		var err error
		if r, err = f.io.StartRestore(ctx); err != nil {
			return xtables.RestoreStats{}, fmt.Errorf("iptables: %w", err)
		}
	}
	_, _ = r.Write(text) // a failed write is reported by Commit
	st, err := r.Commit()
	if err != nil {
		return st, fmt.Errorf("iptables: %w", err)
	}
	return st, nil
}

// ensureJumps puts each jump from a built-in chain in place, first in its
// chain, unless it is already there.
func (f *family) ensureJumps() error {
	var errs []error
	// Walk backwards inserting at the top, so that jumps missing together
	// end up in the order jumps() lists them.
	js := jumps(f.cfg.Family)
	slices.Reverse(js)
	for _, j := range js {
		args := j.Rule.Args()
		ok, err := f.ipt.Exists(j.Table, j.Chain, args...)
		if err != nil {
			errs = append(errs, fmt.Errorf("iptables: check jump %s/%s -> %s: %w", j.Table, j.Chain, j.To(), err))
			continue
		}
		if ok {
			continue
		}
		if err := f.ipt.Insert(j.Table, j.Chain, 1, args...); err != nil {
			errs = append(errs, fmt.Errorf("iptables: insert jump %s/%s -> %s: %w", j.Table, j.Chain, j.To(), err))
		}
	}
	return errors.Join(errs...)
}

// ruleCounts returns how many rules the ruleset holds per table.
func (rs *Ruleset) ruleCounts() map[string]int {
	out := map[string]int{xtables.NAT: 0, xtables.Filter: 0}
	head, tail := staticRules(&rs.cfg)
	for _, r := range append(head, tail...) {
		out[r.table]++
	}
	for _, u := range rs.units {
		for i, t := range tables {
			out[t] += int(u.rules[i])
		}
	}
	return out
}
