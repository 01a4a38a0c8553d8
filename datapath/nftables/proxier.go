package nftables

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/conntrack"
)

// Options configure a Proxier.
type Options struct {
	// MasqueradeBit is the packet-mark bit (0..31) that asks for SNAT, as
	// in the iptables mode (default config: 14).
	MasqueradeBit int
	// ClusterCIDRs are the pod ranges, at most one per family: traffic to
	// a cluster IP from outside them is masqueraded. A family without one
	// masquerades none (kube-proxy's ClusterCIDR mode without a range).
	ClusterCIDRs []netip.Prefix
	// NodePodCIDRs tells pods by the Node's pod range instead (the plan's
	// PodCIDRs, the first of each family: kube-proxy's NodeCIDR mode); a
	// family the Node has no range of tells none.
	NodePodCIDRs bool
	// PodInterface tells pods by the interface their traffic arrives on
	// instead, before NodePodCIDRs and ClusterCIDRs: a name ("cni0",
	// kube-proxy's BridgeInterface mode) or a prefix followed by "+"
	// ("veth+", InterfaceNamePrefix), as in the iptables mode. nft lists
	// it as `iifname "cni0"` or `iifname "veth*"`.
	PodInterface string
	// MasqueradeAll masquerades all traffic to cluster IPs.
	MasqueradeAll bool
	// TCPBeLiberal: nf_conntrack_tcp_be_liberal is set, so out-of-window
	// packets are not INVALID; the "ct state invalid drop" rule is left
	// out (as in the iptables mode).
	TCPBeLiberal bool
	// IPv6 also programs the ip6 table; off, IPv6 frontends are ignored.
	IPv6 bool
	// KeepIPv6Forwarding leaves net.ipv6.conf.all.forwarding alone;
	// otherwise IPv6 turns it on (net.ipv4.ip_forward is always turned
	// on), as in the iptables mode: turning it on makes every interface
	// with accept_ra=1 ignore Router Advertisements, so the agent keeps
	// it on a node that does not route IPv6 yet.
	KeepIPv6Forwarding bool
	// NoSysctls leaves every sysctl alone: for a Proxier made only to
	// find or remove the tables (HoldsRules, Cleanup), as `edgeproxy
	// cleanup` and another mode's start do. It cannot be reconfigured.
	NoSysctls bool
	// NodePortAddresses restricts node ports to the node's own addresses
	// inside these prefixes, looked up at every apply; a family with no
	// prefix here (and no primary address, see NodePortPrimary) answers
	// on every local address (fib daddr type local).
	NodePortAddresses []netip.Prefix
	// NodePortPrimary adds the plan's NodeIPs: kube-proxy's "primary".
	NodePortPrimary bool
	// LocalAddrs lists the node's addresses for NodePortAddresses; nil
	// asks the kernel (net.InterfaceAddrs, in the network namespace of
	// the thread that calls Apply).
	LocalAddrs func() ([]netip.Addr, error)
	// NetNS is a file descriptor of the network namespace to program
	// (tests); 0 means the process's own.
	NetNS  int
	Logger *slog.Logger
	// Registerer takes the datapath's metrics (metrics.go); nil registers
	// none.
	Registerer prometheus.Registerer
	// Conntrack cleans stale UDP entries after each successful apply
	// (*conntrack.Cleaner; it works in the network namespace of the
	// thread that calls Apply). Nil creates a conntrack.Cleaner; set
	// NoConntrack to have none.
	Conntrack   ConntrackCleaner
	NoConntrack bool

	// nodePods are the plan's pod ranges (NodePodCIDRs), one per family.
	nodePods []netip.Prefix
	// shards replaces Shards (tests and benchmarks: 1 is the layout of
	// one service table).
	shards int
	// sockOpts replace google/nftables' sizing of the socket's buffers
	// (tests: a receive buffer too small for a transaction's answers).
	sockOpts []nftables.SockOption
}

// ConntrackCleaner removes stale UDP conntrack entries after an apply.
// *conntrack.Cleaner implements it.
type ConntrackCleaner interface {
	Reconcile(ctx context.Context, frontends []datapath.Frontend, force bool) (int, error)
}

func (o *Options) clusterCIDR(f datapath.Family) (netip.Prefix, bool) {
	for _, p := range o.ClusterCIDRs {
		if datapath.FamilyOf(p.Addr()) == f {
			return p.Masked(), true
		}
	}
	return netip.Prefix{}, false
}

// podMatch is how a table tells traffic from pods (kube-proxy's local
// traffic detector): by its source range (cidr) or by the interface it
// arrives on (iface; a prefix when it ends in "*"). The zero value tells
// none.
type podMatch struct {
	cidr  netip.Prefix
	iface string
}

func (m podMatch) valid() bool { return m.cidr.IsValid() || m.iface != "" }

// pods is how the table of family f tells pods.
func (o *Options) pods(f datapath.Family) podMatch {
	switch {
	case o.PodInterface != "":
		if prefix, ok := strings.CutSuffix(o.PodInterface, "+"); ok {
			return podMatch{iface: prefix + "*"}
		}
		return podMatch{iface: o.PodInterface}
	case o.NodePodCIDRs:
		for _, p := range o.nodePods {
			if datapath.FamilyOf(p.Addr()) == f {
				return podMatch{cidr: p.Masked()}
			}
		}
		return podMatch{}
	}
	if c, ok := o.clusterCIDR(f); ok {
		return podMatch{cidr: c}
	}
	return podMatch{}
}

// followPodCIDRs makes the Node's pod ranges (the first of each family,
// as kube-proxy takes it) those that tell pods; a change rewrites the
// tables (Apply compares each table's podMatch).
func (o *Options) followPodCIDRs(podCIDRs []netip.Prefix, log *slog.Logger) {
	var now []netip.Prefix
	for _, f := range []datapath.Family{datapath.IPv4, datapath.IPv6} {
		for _, p := range podCIDRs {
			if datapath.FamilyOf(p.Addr()) == f {
				now = append(now, p.Masked())
				break
			}
		}
	}
	if slices.Equal(now, o.nodePods) && o.nodePods != nil {
		return
	}
	if len(now) == 0 {
		log.Warn("detectLocalMode NodeCIDR: the Node has no pod range; no traffic is told from pods", "podCIDRs", podCIDRs)
		now = []netip.Prefix{} // read: not nil
	} else {
		log.Info("detectLocalMode NodeCIDR: pods are told by the Node's pod ranges", "podCIDRs", now)
	}
	o.nodePods = now
}

// validate checks the settings New and Reconfigure take.
func (o *Options) validate() error {
	if o.MasqueradeBit < 0 || o.MasqueradeBit > 31 {
		return fmt.Errorf("nftables: masquerade bit %d out of 0..31", o.MasqueradeBit)
	}
	if n := strings.TrimSuffix(o.PodInterface, "+"); len(n) > unix.IFNAMSIZ-1 || o.PodInterface == "+" {
		return fmt.Errorf("nftables: pod interface %q: want a name of at most %d bytes", o.PodInterface, unix.IFNAMSIZ-1)
	}
	return nil
}

// Proxier implements datapath.Backend with nf_tables over netlink.
type Proxier struct {
	opts Options
	log  *slog.Logger
	conn *nftables.Conn
	// connOpts open conn; a pipe opens its own with them.
	connOpts []nftables.ConnOption
	ct       ConntrackCleaner

	m *metrics

	mu        sync.Mutex
	sysctlErr error
	tables    []*table
	stats     Stats
	// The ruleset generation at which Tampered last found our tables as
	// written (verified false: never, or not since).
	verified    bool
	verifiedGen uint32
	// coldBatch and restartBatch bound the transactions of a cold start
	// and of a restart (coldBatchMessages, restartBatchMessages).
	coldBatch, restartBatch int
	// txDone, when set (tests), is called after each transaction of a
	// cold start or a restart but the first.
	txDone func()
	// nodeIPs are the last applied plan's NodeIPs, for Unchanged.
	nodeIPs []netip.Addr

	// tamperState: what Tampered knows of our transactions and the
	// watch's events (tamper.go).
	tamperState
	// sent counts the bytes of the current apply's transactions.
	sent int
}

var _ datapath.Backend = (*Proxier)(nil)

// Stats describe the last successful Apply.
type Stats struct {
	Rebuilt  bool `json:"rebuilt"`  // the tables were written from scratch
	Units    int  `json:"units"`    // service ports built and compared (in the family with most; a compare leaves out those whose frontends did not change)
	Messages int  `json:"messages"` // operations in the transactions (one per chain, rule, set's element list)
	// Transactions is how many nf_tables transactions the apply sent: one,
	// or more for a cold start or a restart sent in bounded parts
	// (coldStart, warmStart).
	Transactions int           `json:"transactions"`
	Duration     time.Duration `json:"duration"` // from the start of Apply to the kernel's answer
	At           time.Time     `json:"at"`       // when it ended

	// Bytes is the size of the netlink messages the transactions sent to
	// the kernel (see queuedBytes).
	Bytes int `json:"bytes"`
}

// Status is what the datapath shows in the agent's status: its last
// apply and its tables as written.
type Status struct {
	LastApply Stats         `json:"lastApply"`
	Tables    []TableStatus `json:"tables"`
	// Warnings name what may keep Services from working though our
	// rules are right: other tables' base chains with policy drop
	// (dropChains), looked up when the status is asked for.
	Warnings []string `json:"warnings,omitempty"`
}

// TableStatus is one family's table as last written.
type TableStatus struct {
	Family  string `json:"family"` // "ip" or "ip6"
	Written bool   `json:"written"`
	// Tables is how many tables the family has: the main one and the
	// service tables.
	Tables       int `json:"tables"`
	Chains       int `json:"chains"` // in all of them
	ServicePorts int `json:"servicePorts"`
}

// Status returns the datapath's status.
func (p *Proxier) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := Status{LastApply: p.stats}
	for _, t := range p.tables {
		ts := TableStatus{Family: t.f.name, Written: t.written, Tables: 1 + p.opts.shardCount()}
		if t.written {
			ts.Chains, ts.ServicePorts = t.chainCount(&p.opts), len(t.units)
		}
		st.Tables = append(st.Tables, ts)
	}
	warn, err := p.dropChains()
	if err != nil {
		warn = append(warn, "cannot look for other tables' drop policies: "+err.Error())
	}
	st.Warnings = warn
	return st
}

// table is the state of one family's table as last written: kept in
// memory, never read back from the kernel.
type table struct {
	f        *fam
	written  bool // a rebuild succeeded since start
	needFull bool // the last apply failed
	units    map[datapath.ServicePortName]*unit
	// counted: the elements units share (the hairpin set's endpoints,
	// the cluster-ips set's addresses), with how many units hold each.
	counted map[shared]int32
	// Node ports: restricted to npIPs (@nodeport-ips), or on every local
	// address (fib) when npIPs is nil.
	npIPs []netip.Addr
	// pods is how the rules written tell pods: a change rewrites the
	// table.
	pods podMatch
	// unitChains counts the units' chains (the fixed ones are not).
	unitChains int
	// partial: the kernel's table is what a cold start that failed
	// half-way left (no base chain, see coldStart): the next apply writes
	// it as a cold start again.
	partial bool
	// restartFailed: a restart's rewrite in bounded transactions
	// (warmStart) failed: the next one replaces the table in one.
	restartFailed bool
}

// chainCount is the number of chains in the table as last written.
func (t *table) chainCount(o *Options) int {
	return len(t.f.fixedChains(o, t.npIPs != nil)) + t.unitChains
}

// New returns a Proxier. It writes nothing until the first Apply, which
// writes the whole plan in bounded transactions: from nothing (coldStart),
// or over the table of our name the kernel holds (warmStart).
func New(o Options) (*Proxier, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	o.nodePods = nil
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.LocalAddrs == nil {
		o.LocalAddrs = interfaceAddrs
	}
	opts := []nftables.ConnOption{nftables.AsLasting()}
	if o.sockOpts != nil {
		opts = append(opts, nftables.WithSockOptions(o.sockOpts...))
	}
	if o.NetNS != 0 {
		opts = append(opts, nftables.WithNetNSFd(o.NetNS))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("nftables: netlink: %w", err)
	}
	m, err := newMetrics(o.Registerer)
	if err != nil {
		_ = c.CloseLasting()
		return nil, err
	}
	p := &Proxier{opts: o, log: o.Logger.With("datapath", "nftables"), conn: c, connOpts: opts, m: m, coldBatch: coldBatchMessages, restartBatch: restartBatchMessages}
	switch {
	case o.NoConntrack:
	case o.Conntrack != nil:
		p.ct = o.Conntrack
	default:
		ct, err := conntrack.New(conntrack.Options{Logger: o.Logger, NodePortAddresses: o.NodePortAddresses, LocalAddrs: o.LocalAddrs})
		if err != nil {
			_ = c.CloseLasting()
			return nil, fmt.Errorf("nftables: %w", err)
		}
		p.ct = ct
	}
	p.tables = append(p.tables, newTable(famIPv4))
	if o.IPv6 {
		p.tables = append(p.tables, newTable(famIPv6))
	}
	if !o.NoSysctls {
		p.setSysctls()
	}
	return p, nil
}

func newTable(f *fam) *table {
	return &table{f: f, units: map[datapath.ServicePortName]*unit{}, counted: map[shared]int32{}}
}

// Name is "nftables".
func (p *Proxier) Name() string { return "nftables" }

// Close releases the netlink socket.
func (p *Proxier) Close() error { return p.conn.CloseLasting() }

// Reconfigure takes the settings of opts that a reload of the agent's
// config may change: the masquerade bit and masqueradeAll, how pods are
// told (ClusterCIDRs, NodePodCIDRs, PodInterface), TCPBeLiberal, the
// node-port addresses and KeepIPv6Forwarding (the sysctls are set again). The next Apply rewrites the tables with them, in
// one transaction as always. What New alone sets stays (IPv6, NetNS,
// LocalAddrs, the conntrack cleaner, the logger). A value New would
// refuse is refused and nothing changes.
func (p *Proxier) Reconfigure(opts Options) error {
	if err := opts.validate(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	o := &p.opts
	o.MasqueradeBit, o.MasqueradeAll, o.TCPBeLiberal = opts.MasqueradeBit, opts.MasqueradeAll, opts.TCPBeLiberal
	o.ClusterCIDRs, o.NodePodCIDRs, o.PodInterface = opts.ClusterCIDRs, opts.NodePodCIDRs, opts.PodInterface
	o.NodePortAddresses, o.NodePortPrimary = opts.NodePortAddresses, opts.NodePortPrimary
	o.KeepIPv6Forwarding = opts.KeepIPv6Forwarding
	if !o.NoSysctls {
		p.setSysctls()
	}
	for _, t := range p.tables {
		t.needFull = true
	}
	if c, ok := p.ct.(interface{ SetNodePortAddresses([]netip.Prefix) }); ok {
		c.SetNodePortAddresses(o.NodePortAddresses)
	}
	return nil
}

// LastStats returns what the last successful Apply did.
func (p *Proxier) LastStats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Apply makes the tables match plan in one nf_tables transaction, so no
// packet sees half of it. The first apply, and the one after a failure,
// writes the tables from scratch; after that only the service ports in
// plan.Changed (all of them when plan.Full) are compared with what was
// written, and only their differences are sent.
func (p *Proxier) Apply(ctx context.Context, plan *datapath.Plan) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	// Frontends this datapath cannot program are left out, each service
	// port concerned reported in a *datapath.PortError after the rest is
	// programmed.
	frontends, refused := supported(plan.Frontends)
	if len(refused) > 0 {
		cp := *plan
		cp.Frontends = frontends
		plan = &cp
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	start := time.Now()
	p.sent = 0
	if p.opts.NodePodCIDRs && p.opts.PodInterface == "" {
		p.opts.followPodCIDRs(plan.PodCIDRs, p.log)
	}
	b := &batch{c: p.conn}
	var pend []*pending
	// rest: the transactions of a table's cold start or restart after
	// the first, sent through a pipe.
	rest := make([]func(*pipe) (int, error), len(p.tables))
	// warm: the table's rest is a restart's (warmStart).
	warm := make([]bool, len(p.tables))
	st := Stats{}
	// Our own transactions need no look by Tampered: when the tables
	// were verified at the generation before the apply, or the apply
	// writes them whole, and the apply's transactions are all that moved
	// it, they are verified after it; and the generations they made are
	// known as ours (see afterApply).
	gen0, genOK := p.beforeApply()
	for i, t := range p.tables {
		ips, err := datapath.NodePortIPs(t.f.family, p.opts.NodePortAddresses, p.opts.NodePortPrimary, plan.NodeIPs, p.opts.LocalAddrs)
		if err != nil {
			return fmt.Errorf("nftables: node-port addresses: %w", err)
		}
		// Whether node ports are restricted is in the fixed rules: a
		// change of it rewrites the table.
		// So is how pods are told, in every Service's rules.
		pods := p.opts.pods(t.f.family)
		rebuild := !t.written || t.needFull || (ips == nil) != (t.npIPs == nil) || pods != t.pods
		groups := group(plan, t.f.family, rebuild || plan.Full)
		var pd *pending
		var other []string // tables of ours the layout has not
		cold, held := false, false
		if rebuild {
			st.Rebuilt = true
			// A table that holds nothing in use is written in bounded
			// transactions; so is one that serves traffic when this
			// process has not written it yet (a restart), Service by
			// Service; any other is replaced in one.
			if cold = t.partial; !cold {
				if held, other, err = p.holds(t); err != nil {
					return err
				}
				cold = !held
			}
		}
		// Tables the kernel holds are rewritten Service by Service in
		// bounded transactions, a restart's or any later rebuild (a
		// failed apply, tampering, a change of every rule): one
		// transaction of every Service's map costs the kernel the
		// square of its size (RATIONALE.md). Only after that failed is
		// the table replaced in one.
		restart := held && !t.restartFailed
		var pr *present
		if restart {
			if pr, err = p.dump(t, p.opts.shardCount()); err != nil {
				return err
			}
			// The main table of the layout before the service tables
			// (its own dispatch maps, their elements naming its
			// Service chains) is replaced in one transaction: a
			// restart's steps would delete those chains before the
			// elements pointing at them.
			restart = !pr.sets[objRef{0, mapServiceIPs}] && !pr.sets[objRef{0, mapNodePorts}]
		}
		warm[i] = restart
		switch {
		case cold:
			pd, rest[i] = t.coldStart(b, &p.opts, p.coldBatch, groups, ips)
		case restart:
			pd, rest[i] = t.warmStart(b, &p.opts, p.restartBatch, groups, ips, pr)
		case rebuild:
			pd, err = t.rebuild(b, &p.opts, groups, ips, other)
		default:
			pd, err = t.update(b, &p.opts, groups, plan, ips)
		}
		if err != nil {
			return err // nothing was queued on the connection yet
		}
		pd.pods = pods
		st.Units = max(st.Units, pd.n)
		pend = append(pend, pd)
	}
	st.Messages = b.run()
	if st.Messages > 0 {
		st.Transactions = 1
	}
	if err := p.flush(); err != nil {
		for i, t := range p.tables {
			t.needFull = true
			t.restartFailed = t.restartFailed || warm[i]
		}
		p.m.failures.Inc()
		return fmt.Errorf("nftables: apply plan %d: %w", plan.Generation, err)
	}
	var coldErr error
	var pp *pipe
	for i, t := range p.tables {
		if rest[i] == nil {
			continue
		}
		var msgs int
		var err error
		switch {
		case pp == nil:
			if pp, err = p.newPipe(); err != nil {
				break
			}
			fallthrough
		case pp.err == nil:
			msgs, err = rest[i](pp)
		default:
			err = fmt.Errorf("nftables: the %s table's transactions were not sent after an earlier failure", t.f.name)
		}
		st.Messages += msgs
		t.partial = err != nil && !warm[i]
		t.restartFailed = err != nil && warm[i]
		if err != nil {
			t.needFull = true
			pend[i] = nil
			coldErr = errors.Join(coldErr, err)
		}
	}
	if pp != nil {
		pp.close()
		st.Transactions += pp.txs
	}
	if coldErr != nil {
		for i, t := range p.tables {
			if pend[i] != nil {
				pend[i].commit(t)
			}
		}
		p.m.failures.Inc()
		return fmt.Errorf("nftables: apply plan %d: %w", plan.Generation, coldErr)
	}
	st.At = time.Now()
	st.Duration = st.At.Sub(start)
	if st.Rebuilt {
		p.m.fullDuration.Observe(st.Duration.Seconds())
	} else {
		p.m.partialDuration.Observe(st.Duration.Seconds())
	}
	p.m.ops.Set(float64(st.Messages))
	st.Bytes = p.sent
	p.m.bytes.Set(float64(st.Bytes))
	for i, t := range p.tables {
		pend[i].commit(t)
		p.m.chains.WithLabelValues(t.f.name).Set(float64(t.chainCount(&p.opts)))
	}
	p.afterApply(gen0, genOK, whole(pend), st.Transactions)
	p.nodeIPs = slices.Clone(plan.NodeIPs)
	p.stats = st
	// A failed conntrack cleanup does not fail the apply: the rules are
	// right, the cleaner counts the failure, and the next sync tries
	// again (as in the iptables mode).
	if p.ct != nil {
		if _, err := p.ct.Reconcile(ctx, plan.Frontends, plan.Full); err != nil {
			p.log.Warn("conntrack cleanup after the apply failed; retried next sync", "err", err)
		}
	}
	return errors.Join(refused...)
}

// group collects the frontends of family fam by service port: all of
// them, or only the changed ones (found by name: a one-Service change
// does not walk every frontend).
func group(plan *datapath.Plan, f datapath.Family, all bool) map[datapath.ServicePortName][]datapath.Frontend {
	out := map[datapath.ServicePortName][]datapath.Frontend{}
	add := func(fs []datapath.Frontend) {
		for i := range fs {
			if fr := &fs[i]; fr.Family == f {
				out[fr.Service] = append(out[fr.Service], *fr)
			}
		}
	}
	if all {
		add(plan.Frontends)
		return out
	}
	for name := range plan.Changed {
		add(plan.PortFrontends(name))
	}
	return out
}

// pending is what a table will hold once the batch is committed.
type pending struct {
	replace bool // units and counted replace the table's
	units   map[datapath.ServicePortName]*unit
	counted map[shared]int32 // the new counts (replace) or the deltas
	n       int              // service ports compared
	npIPs   []netip.Addr
	pods    podMatch
}

func (pd *pending) commit(t *table) {
	t.npIPs, t.pods = pd.npIPs, pd.pods
	if pd.replace {
		t.units, t.counted = pd.units, pd.counted
		t.written, t.needFull = true, false
		t.unitChains = 0
		for _, u := range t.units {
			t.unitChains += len(u.held)
		}
		return
	}
	for s, u := range pd.units {
		if old := t.units[s]; old != nil {
			t.unitChains -= len(old.held)
		}
		if u == nil {
			delete(t.units, s)
		} else {
			t.units[s] = u
			t.unitChains += len(u.held)
		}
	}
	for k, d := range pd.counted {
		if n := t.counted[k] + d; n > 0 {
			t.counted[k] = n
		} else {
			delete(t.counted, k)
		}
	}
}

// interfaceAddrs lists the addresses of every interface.
func interfaceAddrs() ([]netip.Addr, error) {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range as {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}

// flush sends the queued messages as one transaction. Its answers (the
// kernel echoes every rule added, and acknowledges errors) are read from
// a receive buffer google/nftables sizes to the transaction (1 KiB a
// message, forced past net.core.rmem_max as root; with the bounded
// transactions of a cold start, about 8 MiB at most). Should they overrun
// it all the same, the read reports ENOBUFS though the transaction may
// have committed: the kernel sends the echoes only once it committed, and
// an error aborts the whole batch. So an ENOBUFS is looked into with the
// ruleset generation: moved by exactly one since before the send, the
// transaction committed (counted in MetricOverruns); otherwise the error
// stands, and the next apply rewrites the tables.
func (p *Proxier) flush() error { return p.flushOn(p.conn) }

// flushOn is flush on connection c (p.conn, or a pipe's). It counts
// the bytes sent (a pipe's goroutine adds to p.sent while Apply waits
// for it).
func (p *Proxier) flushOn(c *nftables.Conn) error {
	before, gerr := c.GetGen()
	p.sent += queuedBytes(c)
	err := c.Flush()
	if err == nil || gerr != nil || !errors.Is(err, unix.ENOBUFS) {
		return err
	}
	after, aerr := c.GetGen()
	if aerr != nil || after.ID != before.ID+1 {
		return err
	}
	p.m.overruns.Inc()
	p.log.Debug("the answers to a transaction overran the receive buffer; the ruleset generation shows it committed", "err", err)
	return nil
}
