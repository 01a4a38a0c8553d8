// Package ipvs is the IPVS datapath (mode: ipvs). Every frontend of a plan
// becomes an IPVS virtual server (NodePorts one per node address) with
// masquerading real servers that carry the plan's weights; every service
// address is bound to a dummy link so the kernel accepts the packets; and
// a constant handful of iptables rules, matching ipsets that hold the
// per-service data, marks what must be masqueraded and refuses what has no
// endpoints. Changes are made by diffing against what the kernel holds.
//
// All kernel operations act on the network namespace of the calling
// thread (the IPVS handle: the one New ran in), so New and Apply must run
// in the same namespace.
package ipvs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	goipt "github.com/coreos/go-iptables/iptables"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/ipset"
	"github.com/edgeproxy/edgeproxy/datapath/sysctl"
	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// Stats count what one Apply changed, by kind of kernel object.
type Stats struct {
	VirtualServers struct{ Added, Updated, Deleted int }
	RealServers    struct{ Added, Updated, Deleted, Draining int }
	Addresses      int // addresses bound or unbound on the dummy link
	SetEntries     int // ipset entries added or deleted, sets created
	// Reads are the kernel dumps made (virtual-server and real-server
	// lists); together with the changes above they are the netlink
	// operations of the sync.
	Reads    int
	Duration time.Duration
}

// Ops is the number of netlink operations the sync made.
func (s Stats) Ops() int {
	return s.VirtualServers.Added + s.VirtualServers.Updated + s.VirtualServers.Deleted +
		s.RealServers.Added + s.RealServers.Updated + s.RealServers.Deleted +
		s.Addresses + s.SetEntries + s.Reads
}

// Proxier is the IPVS datapath.Backend.
type Proxier struct {
	opts Options
	k    Kernel
	link dummy
	ipt  []iptables // one per family, IPv4 first
	log  *slog.Logger
	m    *metrics

	mu          sync.Mutex
	applied     map[Key]*desiredServer // virtual servers as last programmed
	synced      bool                   // the last Apply succeeded: applied, lastVIPs, lastEntries match the kernel
	lastVIPs    map[netip.Addr]bool
	lastEntries map[string][]ipset.Entry
	terminating map[Key]map[netip.AddrPort]time.Time
	// retry holds the virtual servers the kernel refused (or refused a real
	// server of) in the last Apply: partial syncs revisit them until they
	// are programmed.
	retry   map[Key]bool
	logged  map[string]bool
	rulesOK bool
	// podCIDRs are the Node's pod ranges the rules tell pods by
	// (NodePodCIDRs), as of the last Apply.
	podCIDRs     []netip.Prefix
	podCIDRsRead bool
	last         Stats
	sysctlErr    error
}

var (
	_ datapath.Backend = (*Proxier)(nil)
	_ datapath.Monitor = (*Proxier)(nil)
	_ datapath.Drainer = (*Proxier)(nil)
)

// New prepares the IPVS datapath in the calling thread's network
// namespace: loads ip_vs, opens the IPVS handle, sets the sysctls IPVS
// needs and the connection timeouts. Sysctl failures are logged and kept
// (SysctlErrors), not fatal: some are read-only in containers.
func New(opts Options) (*Proxier, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	p := &Proxier{
		opts: opts, link: dummy{opts.Interface},
		log:         opts.Logger.With("datapath", "ipvs"),
		applied:     map[Key]*desiredServer{},
		terminating: map[Key]map[netip.AddrPort]time.Time{},
		retry:       map[Key]bool{},
		logged:      map[string]bool{},
	}
	if p.m, err = newMetrics(opts.Registerer); err != nil {
		return nil, err
	}
	p.k = opts.Kernel
	if p.k == nil {
		if err := LoadModules("ip_vs", "nf_conntrack", "dummy"); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrNoIPVS, err)
		}
		k, err := Open()
		if err != nil {
			return nil, err
		}
		if _, err := k.VirtualServers(); err != nil {
			k.Close()
			return nil, fmt.Errorf("%w: %w", ErrNoIPVS, err)
		}
		p.k = k
		if err := p.openIPTables(); err != nil {
			k.Close()
			return nil, err
		}
		if err := sysctl.Ensure(opts.newSysctls(kernelRelease())); err != nil {
			p.sysctlErr = err
			p.log.Warn("some sysctls could not be set", "err", err)
		}
		if opts.TCPTimeout != 0 || opts.TCPFinTimeout != 0 || opts.UDPTimeout != 0 {
			if err := k.SetTimeouts(opts.TCPTimeout, opts.TCPFinTimeout, opts.UDPTimeout); err != nil {
				k.Close()
				return nil, err
			}
		}
	}
	return p, nil
}

// openIPTables opens the iptables tools (ip6tables too with IPv6) for the
// static rules and refuses to run when our chains exist under both
// backends, as iptables mode does.
func (p *Proxier) openIPTables() error {
	for _, fam := range p.families() {
		x, err := xtables.Open(p.opts.Variant, fam, p.opts.LockWait)
		if err != nil {
			return fmt.Errorf("ipvs: %w", err)
		}
		if err := x.CheckOtherBackend(context.Background(), "nat", chainServices, p.log); err != nil {
			return fmt.Errorf("ipvs: %w", err)
		}
		t := iptables{x: x, fam: fam}
		if g, err := goipt.New(goipt.IPFamily(goiptProto(fam)), goipt.Path(x.IPTables), goipt.Timeout(x.WaitSeconds())); err == nil {
			t.randomFully = g.HasRandomFully()
		}
		p.ipt = append(p.ipt, t)
	}
	return nil
}

func goiptProto(f datapath.Family) goipt.Protocol {
	if f == datapath.IPv6 {
		return goipt.ProtocolIPv6
	}
	return goipt.ProtocolIPv4
}

// families are the IP families this Proxier programs.
func (p *Proxier) families() []datapath.Family { return p.cfg(nil).families() }

// cfg is the computation's configuration.
func (p *Proxier) cfg(nodeAddrs []netip.Addr) config {
	return config{Scheduler: p.opts.Scheduler, SchedulerFlags: p.opts.SchedulerFlags, NodeAddresses: nodeAddrs, IPv6: p.opts.IPv6}
}

// LoadModules makes sure the named kernel modules are present (loaded or
// built in), running modprobe for the missing ones, and names those that
// are still missing.
func LoadModules(names ...string) error {
	var missing []string
	for _, n := range names {
		if _, err := os.Stat("/sys/module/" + n); err == nil {
			continue
		}
		if out, err := exec.Command("modprobe", n).CombinedOutput(); err != nil {
			missing = append(missing, fmt.Sprintf("%s (%s)", n, strings.TrimSpace(string(out))))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("ipvs: kernel modules missing: %s", strings.Join(missing, ", "))
	}
	return nil
}

func (p *Proxier) SysctlErrors() error { return p.sysctlErr }

// Name is the mode.
func (p *Proxier) Name() string { return "ipvs" }

// LastStats returns the statistics of the last Apply.
func (p *Proxier) LastStats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

// Close releases the IPVS handle; kernel state stays.
func (p *Proxier) Close() error { return p.k.Close() }

// Apply makes the kernel match plan. The dummy link, ipsets and iptables
// rules are brought in line first, then the virtual servers: on a full
// plan every one is compared with the kernel; otherwise only those of
// changed services, new or vanished ones, and those with draining real
// servers.
func (p *Proxier) Apply(ctx context.Context, plan *datapath.Plan) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	start := time.Now() // real time for the measurement; opts.Now drives grace periods
	var st Stats
	// After a failure, or when asked, compare everything with the kernel;
	// otherwise trust what the last successful Apply left. Until this
	// Apply succeeds, the next one is full.
	full := plan.Full || !p.synced
	p.synced = false
	defer func() { p.record(&st, start, full) }()

	nodeAddrs, err := p.nodeAddrs(plan.NodeIPs)
	if err != nil {
		return err
	}
	// Frontends that cannot be programmed are left out as PortErrors
	// (shown as refused in status); the rest is programmed.
	want, cerr := compute(p.cfg(nodeAddrs), plan)
	for _, ds := range want.Servers {
		if ds.Weighted {
			p.logOnce("weighted scheduler", "service", ds.Service, "scheduler", ds.VS.Scheduler,
				"why", "endpoint weights differ and the chosen scheduler ignores weights")
		}
	}
	errs := []error{cerr}
	var bound map[netip.Addr]bool
	if full || !maps.Equal(want.VIPs, p.lastVIPs) {
		var err error
		if bound, err = p.link.addresses(); err != nil {
			return err
		}
		n, err := p.link.sync(want.VIPs)
		st.Addresses += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, p.syncSets(want, full, &st)...)
	if p.opts.NodePodCIDRs && p.opts.PodInterface == "" {
		p.followPodCIDRs(plan.PodCIDRs)
	}
	if full || !p.rulesOK {
		p.rulesOK = true
		for _, t := range p.ipt {
			text, err := p.ruleText(t)
			if err == nil {
				err = t.ensure(ctx, text)
			}
			if err != nil {
				errs = append(errs, err)
				p.rulesOK = false
			}
		}
	}
	if full {
		err = p.fullSyncServers(want, bound, nodeAddrs, &st)
	} else {
		err = p.partialSyncServers(plan, want, &st)
	}
	if err != nil {
		errs = append(errs, err)
	}
	// Refused service ports do not fail the sync: the rest is in the
	// kernel, and the refused ones are in p.retry for the next Apply.
	all := errors.Join(errs...)
	if _, rest := datapath.SplitPortErrors(all); rest != nil {
		p.rulesOK = false
		return all
	}
	p.synced, p.lastVIPs, p.lastEntries = true, want.VIPs, want.Entries
	return all
}

// record keeps an Apply's stats and updates the metrics.
func (p *Proxier) record(st *Stats, start time.Time, full bool) {
	st.Duration = time.Since(start)
	p.last = *st
	if full {
		p.m.fullDuration.Observe(st.Duration.Seconds())
	} else {
		p.m.partialDuration.Observe(st.Duration.Seconds())
	}
	if !p.synced {
		p.m.failures.Inc()
	}
	p.m.ops.Set(float64(st.Ops()))
	p.m.virtualServers.Set(float64(len(p.applied)))
	n := 0
	for _, t := range p.terminating {
		n += len(t)
	}
	p.m.draining.Set(float64(n))
}

// syncSets makes the ipsets hold want's entries: all of them on a full
// sync, otherwise those whose entries changed since the last success.
func (p *Proxier) syncSets(want *desired, full bool, st *Stats) []error {
	var errs []error
	var all []ipset.Set
	for _, fam := range p.families() {
		all = append(all, sets(fam)...)
	}
	for _, s := range all {
		if !full && slices.Equal(want.Entries[s.Name], p.lastEntries[s.Name]) {
			continue
		}
		ss, err := ipset.Sync(ipset.Netlink{}, s, want.Entries[s.Name])
		st.SetEntries += ss.Added + ss.Deleted + ss.Created + ss.Replaced
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// nodeAddrs returns where NodePorts are served (Options.NodeAddresses):
// per family, the node's addresses inside NodePortCIDRs and, with
// NodePortPrimary, its primary addresses (nodeIPs, the plan's); every
// address of a family nothing restricts, as kube-proxy.
func (p *Proxier) nodeAddrs(nodeIPs []netip.Addr) ([]netip.Addr, error) {
	if p.opts.NodeAddresses != nil {
		return p.opts.NodeAddresses, nil
	}
	all, err := nodeAddresses(p.opts.Interface, p.opts.IPv6)
	if err != nil {
		return nil, err
	}
	return nodePortAddrs(all, p.families(), p.opts.NodePortCIDRs, p.opts.NodePortPrimary, nodeIPs), nil
}

// nodePortAddrs keeps, of the node's addresses all, those NodePorts are
// served on in families fams (see Proxier.nodeAddrs).
func nodePortAddrs(all []netip.Addr, fams []datapath.Family, cidrs []netip.Prefix, primary bool, nodeIPs []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, fam := range fams {
		ips, _ := datapath.NodePortIPs(fam, cidrs, primary, nodeIPs, func() ([]netip.Addr, error) { return all, nil })
		if ips == nil {
			ips = slices.DeleteFunc(slices.Clone(all), func(a netip.Addr) bool { return datapath.FamilyOf(a) != fam })
		}
		out = append(out, ips...)
	}
	return out
}

func (p *Proxier) ruleText(t iptables) (string, error) {
	cidrs := p.opts.ClusterCIDRs
	if p.opts.NodePodCIDRs {
		cidrs = p.podCIDRs
	}
	return renderRules(ruleConfig{Family: t.fam, RandomFully: t.randomFully, ClusterCIDRs: cidrs, PodInterface: p.opts.PodInterface,
		MasqueradeAll: p.opts.MasqueradeAll, MarkBit: p.opts.MasqueradeBit})
}

// followPodCIDRs makes the Node's pod ranges (the first of each family,
// as kube-proxy takes them) the ones that tell pods; a change has the
// static rules written again.
func (p *Proxier) followPodCIDRs(podCIDRs []netip.Prefix) {
	var cidrs []netip.Prefix
	for _, fam := range p.families() {
		if i := slices.IndexFunc(podCIDRs, func(c netip.Prefix) bool { return datapath.FamilyOf(c.Addr()) == fam }); i >= 0 {
			cidrs = append(cidrs, podCIDRs[i].Masked())
		}
	}
	if p.podCIDRsRead && slices.Equal(cidrs, p.podCIDRs) {
		return
	}
	p.podCIDRsRead = true
	if len(cidrs) < len(p.families()) {
		p.log.Warn("detectLocalMode NodeCIDR: the Node lacks a pod range of a family; no traffic of that family is told from pods", "podCIDRs", podCIDRs)
	}
	if len(cidrs) > 0 {
		p.log.Info("detectLocalMode NodeCIDR: pods are told by the Node's pod ranges", "podCIDRs", cidrs)
	}
	p.podCIDRs = cidrs
	p.rulesOK = false
}

func (p *Proxier) logOnce(msg string, args ...any) {
	key := fmt.Sprint(msg, args)
	if p.logged[key] {
		return
	}
	p.logged[key] = true
	p.log.Info(msg, args...)
}

// fullSyncServers diffs every virtual and real server with the kernel. A
// virtual server is ours when its address is (or was) bound on the dummy
// link, is a node address, or was programmed by this process; others are
// left alone.
func (p *Proxier) fullSyncServers(want *desired, bound map[netip.Addr]bool, nodeAddrs []netip.Addr, st *Stats) error {
	have, err := p.k.VirtualServers()
	st.Reads++
	if err != nil {
		return err
	}
	node := map[netip.Addr]bool{}
	for _, a := range nodeAddrs {
		node[a] = true
	}
	ours := func(k Key) bool {
		_, applied := p.applied[k]
		return bound[k.Addr] || want.VIPs[k.Addr] || node[k.Addr] || applied
	}
	kernel := make(map[Key]VirtualServer, len(have))
	for _, v := range have {
		kernel[v.Key()] = v
	}
	var errs []error
	applied := make(map[Key]*desiredServer, len(want.Servers))
	p.retry = map[Key]bool{}
	for key, ds := range want.Servers {
		kv, exists := kernel[key]
		if !exists {
			added, err := p.addServer(ds, st)
			if added {
				applied[key] = ds
			}
			errs = append(errs, p.refused(ds, err))
			continue
		}
		applied[key] = ds
		if kv != ds.VS {
			if err := p.k.UpdateVirtualServer(ds.VS); err != nil {
				errs = append(errs, p.refused(ds, err))
			} else {
				st.VirtualServers.Updated++
			}
		}
		errs = append(errs, p.refused(ds, p.syncReals(ds.VS, ds.Reals, st)))
	}
	for key, kv := range kernel {
		if _, keep := want.Servers[key]; keep || !ours(key) {
			continue
		}
		if err := p.k.DeleteVirtualServer(kv); err != nil {
			errs = append(errs, err)
			continue
		}
		st.VirtualServers.Deleted++
		delete(p.terminating, key)
	}
	p.applied = applied
	return errors.Join(errs...)
}

// partialSyncServers trusts that the kernel holds what the last successful
// Apply programmed and compares only the virtual servers of changed
// services, new and vanished ones, and those with draining real servers:
// a one-endpoint change costs one real-server dump and one update.
func (p *Proxier) partialSyncServers(plan *datapath.Plan, want *desired, st *Stats) error {
	var errs []error
	retry := p.retry
	p.retry = map[Key]bool{}
	for key, ds := range want.Servers {
		prev, had := p.applied[key]
		if had && prev.Service == ds.Service && !plan.Changed[ds.Service] && len(p.terminating[key]) == 0 && !retry[key] {
			continue
		}
		if !had {
			added, err := p.addServer(ds, st)
			if added {
				p.applied[key] = ds
			}
			errs = append(errs, p.refused(ds, err))
			continue
		}
		if prev.VS != ds.VS {
			if err := p.k.UpdateVirtualServer(ds.VS); err != nil {
				errs = append(errs, p.refused(ds, err))
				continue
			}
			st.VirtualServers.Updated++
		}
		p.applied[key] = ds
		errs = append(errs, p.refused(ds, p.syncReals(ds.VS, ds.Reals, st)))
	}
	for key, prev := range p.applied {
		if _, keep := want.Servers[key]; keep {
			continue
		}
		if err := p.k.DeleteVirtualServer(prev.VS); err != nil {
			errs = append(errs, err)
			continue
		}
		st.VirtualServers.Deleted++
		delete(p.applied, key)
		delete(p.terminating, key)
	}
	return errors.Join(errs...)
}

// refused turns err, the kernel refusing ds or one of its real servers,
// into a PortError of ds's service port and marks ds to be tried again
// by the next Apply. It returns nil for a nil err.
func (p *Proxier) refused(ds *desiredServer, err error) error {
	if err == nil {
		return nil
	}
	p.retry[ds.VS.Key()] = true
	return portError(ds.Service, err)
}

// addServer creates a virtual server with all its real servers. added
// reports whether the virtual server itself was created, even when some
// of its real servers were refused.
func (p *Proxier) addServer(ds *desiredServer, st *Stats) (added bool, err error) {
	if err := p.k.AddVirtualServer(ds.VS); err != nil {
		return false, err
	}
	st.VirtualServers.Added++
	var errs []error
	for _, r := range ds.Reals {
		if err := p.k.AddRealServer(ds.VS, r); err != nil {
			errs = append(errs, err)
			continue
		}
		st.RealServers.Added++
	}
	return true, errors.Join(errs...)
}

// syncReals makes the real servers of vs match want; those no longer
// wanted are retired (drained or deleted, see retire).
func (p *Proxier) syncReals(vs VirtualServer, want []RealServer, st *Stats) error {
	have, err := p.k.RealServers(vs)
	st.Reads++
	if err != nil {
		return err
	}
	key := vs.Key()
	now := p.opts.Now()
	cur := make(map[netip.AddrPort]RealServer, len(have))
	for _, r := range have {
		cur[r.Addr] = r
	}
	var errs []error
	wanted := make(map[netip.AddrPort]bool, len(want))
	for _, r := range want {
		wanted[r.Addr] = true
		delete(p.terminating[key], r.Addr)
		c, ok := cur[r.Addr]
		switch {
		case !ok:
			if err := p.k.AddRealServer(vs, r); err != nil {
				errs = append(errs, err)
				continue
			}
			st.RealServers.Added++
		case c.Weight != r.Weight:
			if err := p.k.UpdateRealServer(vs, r); err != nil {
				errs = append(errs, err)
				continue
			}
			st.RealServers.Updated++
		}
	}
	for _, c := range have {
		if !wanted[c.Addr] {
			errs = append(errs, p.retire(vs, c, now, st))
		}
	}
	if len(p.terminating[key]) == 0 {
		delete(p.terminating, key)
	}
	return errors.Join(errs...)
}

// retire handles a real server of vs that left the plan. A TCP one drains:
// it is set to weight 0 (no new connections) and deleted once the kernel
// counts no active or inactive connections on it, or when its grace period
// is over, whichever comes first; a deletion that cuts live connections is
// logged. UDP and SCTP real servers are deleted at once, as kube-proxy
// does: with expire_nodest_conn=1 their next packet is scheduled again.
func (p *Proxier) retire(vs VirtualServer, c RealServer, now time.Time, st *Stats) error {
	key := vs.Key()
	if vs.Protocol == datapath.TCP {
		if c.Weight != 0 {
			c.Weight = 0
			if err := p.k.UpdateRealServer(vs, c); err != nil {
				return err
			}
			st.RealServers.Updated++
		}
		if p.terminating[key] == nil {
			p.terminating[key] = map[netip.AddrPort]time.Time{}
		}
		since, ok := p.terminating[key][c.Addr]
		if !ok {
			since = now
			p.terminating[key][c.Addr] = now
		}
		live := c.Active + c.Inactive
		if live > 0 && now.Sub(since) < p.opts.GracePeriod {
			st.RealServers.Draining++
			return nil
		}
		if live > 0 {
			p.log.Warn("grace period over: deleting a real server that still has connections",
				"virtualServer", key, "realServer", c.Addr, "active", c.Active, "inactive", c.Inactive,
				"gracePeriod", p.opts.GracePeriod)
		}
	}
	if err := p.k.DeleteRealServer(vs, c); err != nil {
		return err
	}
	st.RealServers.Deleted++
	delete(p.terminating[key], c.Addr)
	return nil
}

// Draining reports how many real servers wait at weight 0 for their
// connections to end. The agent keeps syncing while it is not zero.
func (p *Proxier) Draining() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, m := range p.terminating {
		n += len(m)
	}
	return n
}

// Tampered reports whether kernel objects this datapath programmed have
// gone behind its back: our iptables rules or jumps (a flushed table), a
// service address on the dummy link, an ipset's entries, or a virtual
// server.
func (p *Proxier) Tampered(ctx context.Context) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, t := range p.ipt {
		n, err := t.countRules(ctx)
		if err != nil {
			return false, err
		}
		text, err := p.ruleText(t)
		if err != nil {
			return false, err
		}
		if want := ruleCount(text) + len(jumps()); n != want {
			return true, nil
		}
	}
	bound, err := p.link.addresses()
	if err != nil {
		return false, err
	}
	for a := range p.lastVIPs {
		if !bound[a] {
			return true, nil
		}
	}
	if bad, err := p.setsTampered(); bad || err != nil {
		return bad, err
	}
	vss, err := p.k.VirtualServers()
	if err != nil {
		return false, err
	}
	have := make(map[Key]bool, len(vss))
	for _, v := range vss {
		have[v.Key()] = true
	}
	for k := range p.applied {
		if !have[k] {
			return true, nil
		}
	}
	return false, nil
}

// setsTampered reports whether an ipset of ours is missing or holds
// other entries than the last successful Apply left (a set flushed or
// edited by hand).
func (p *Proxier) setsTampered() (bool, error) {
	if !p.synced {
		return false, nil // the next Apply is full anyway
	}
	for _, fam := range p.families() {
		for _, s := range sets(fam) {
			ok, err := ipset.Holds(ipset.Netlink{}, s, p.lastEntries[s.Name])
			if err != nil || !ok {
				return !ok, err
			}
		}
	}
	return false, nil
}

func ruleCount(text string) int {
	n := 0
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "-A ") {
			n++
		}
	}
	return n
}

// Cleanup removes every virtual server this datapath may have made (those
// on the dummy link's addresses, on node addresses, or programmed by this
// process) but those Options.Leave names, the dummy link, the iptables
// rules and the ipsets.
func (p *Proxier) Cleanup(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	bound, err := p.link.addresses()
	if err != nil {
		errs = append(errs, err)
	}
	nodeAddrs, _ := p.nodeAddrs(nil)
	node := map[netip.Addr]bool{}
	for _, a := range nodeAddrs {
		node[a] = true
	}
	vss, err := p.k.VirtualServers()
	if err != nil {
		errs = append(errs, err)
	}
	deleted, left := 0, 0
	for _, v := range vss {
		_, applied := p.applied[v.Key()]
		if p.opts.Leave != nil && p.opts.Leave(v.Key()) {
			p.log.Debug("cleanup: leaving a virtual server kube-proxy claims", "virtualServer", v.Key())
			left++
			continue
		}
		if bound[v.Addr] || node[v.Addr] || applied {
			p.log.Debug("cleanup: deleting a virtual server", "virtualServer", v.Key())
			if err := p.k.DeleteVirtualServer(v); err != nil {
				errs = append(errs, err)
				continue
			}
			deleted++
		}
	}
	p.applied = map[Key]*desiredServer{}
	p.synced = false
	p.terminating = map[Key]map[netip.AddrPort]time.Time{}
	p.log.Debug("cleanup: removing the dummy link", "link", p.opts.Interface, "addresses", len(bound))
	if err := p.link.remove(); err != nil {
		errs = append(errs, err)
	}
	p.log.Debug("cleanup: removing the rules")
	for _, t := range p.ipt {
		if err := t.remove(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	p.log.Debug("cleanup: destroying the sets")
	names := slices.Clone(legacySets)
	for _, s := range allSets() {
		names = append(names, s.Name)
	}
	for _, n := range names {
		if err := ipset.Destroy(ipset.Netlink{}, n); err != nil {
			errs = append(errs, err)
		}
	}
	p.log.Debug("cleanup: done", "virtualServersDeleted", deleted, "virtualServersLeft", left)
	p.rulesOK = false
	return errors.Join(errs...)
}
