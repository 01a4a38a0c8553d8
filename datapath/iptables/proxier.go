// Package iptables is the iptables datapath: it programs a datapath.Plan as
// plain iptables chains (see datapath/README.md for the packet path). Rule
// text is rendered by pure functions (Render) and written atomically with
// iptables-restore --noflush; only the jumps from the built-in chains are
// managed rule by rule, through go-iptables.
package iptables

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
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
