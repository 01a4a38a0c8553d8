package ipvs

import (
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/datapath/sysctl"
	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// The Proxier's settings: Options, their defaults, what may change while
// it runs (Reconfigure), and the kernel parameters they need.

// Options configure a Proxier. Zero values take the defaults noted.
type Options struct {
	Interface      string   // dummy link for service addresses; "edgeproxy0"
	Scheduler      string   // default scheduler; "rr"
	SchedulerFlags []string // for the default scheduler, e.g. "sh-fallback"
	StrictARP      bool     // arp_ignore=1, arp_announce=2
	// Leave names virtual servers Cleanup leaves although they are on
	// the dummy link's or the node's addresses: kube-proxy's, when it
	// runs again before `edgeproxy cleanup` and programs the same keys.
	Leave func(Key) bool
	// GracePeriod bounds how long a removed TCP real server stays at
	// weight 0 while it still has connections; 30s. UDP and SCTP real
	// servers are deleted at once.
	GracePeriod time.Duration
	// IPv6 programs IPv6 frontends too (IPv6 virtual servers, sets,
	// ip6tables rules, addresses on the dummy link); without it they are
	// refused. The agent sets it where IPv6 works, as kube-proxy.
	IPv6 bool
	// KeepIPv6Forwarding leaves net.ipv6.conf.all.forwarding alone;
	// otherwise IPv6 turns it on. Turning it on makes every interface
	// with accept_ra=1 ignore Router Advertisements and drops the
	// default routes they gave: the agent keeps it on a node that does
	// not route IPv6 yet (no global IPv6 address, no IPv6 clusterCIDR),
	// whose IPv6 may come by SLAAC, as it did before it proxied IPv6
	// there (pods with IPv6 mean the CNI turned forwarding on).
	KeepIPv6Forwarding bool
	// NodeAddresses are where NodePorts are served; nil means every
	// global unicast address (IPv4, and IPv6 with IPv6) on the node's
	// links (but the dummy), looked up at each Apply; of a family that
	// NodePortCIDRs or NodePortPrimary restrict, only those inside them
	// (config nodePortAddresses).
	NodeAddresses []netip.Addr
	NodePortCIDRs []netip.Prefix
	// NodePortPrimary adds the node's primary addresses (the plan's
	// NodeIPs) to NodePortCIDRs: kube-proxy's "primary" keyword.
	NodePortPrimary bool
	// ClusterCIDRs tell traffic from pods by its source (the first of
	// each family), as kube-proxy's local-traffic detector: ClusterIP
	// traffic from elsewhere is masqueraded.
	ClusterCIDRs []netip.Prefix
	// NodePodCIDRs tells pods by the plan's PodCIDRs (the Node's
	// spec.podCIDRs) instead, followed at every Apply (kube-proxy's
	// detect-local-mode NodeCIDR).
	NodePodCIDRs bool
	// PodInterface tells pods by the interface their traffic arrives on
	// instead: "cni0" (BridgeInterface), "veth+" (InterfaceNamePrefix).
	PodInterface  string
	MasqueradeAll bool
	MasqueradeBit int // 0..31; 14
	// IPVS connection timeouts; zero keeps the kernel's.
	TCPTimeout, TCPFinTimeout, UDPTimeout time.Duration
	// Variant selects the iptables backend of the static rules; Auto
	// uses whatever "iptables" resolves to (datapath/xtables).
	Variant xtables.Variant
	// LockWait bounds the wait for the xtables lock (default 5s).
	LockWait time.Duration
	// Kernel, if set, replaces the netlink IPVS handle (unit tests).
	Kernel     Kernel
	Registerer prometheus.Registerer // nil: metrics are kept but not registered
	Logger     *slog.Logger
	Now        func() time.Time
}

// withDefaults returns opts with the defaults filled in, or why it cannot
// be used.
func (opts Options) withDefaults() (Options, error) {
	if opts.Interface == "" {
		opts.Interface = "edgeproxy0"
	}
	if opts.Scheduler == "" {
		opts.Scheduler = "rr"
	}
	if opts.GracePeriod == 0 {
		opts.GracePeriod = 30 * time.Second
	}
	if opts.MasqueradeBit == 0 {
		opts.MasqueradeBit = 14
	}
	if opts.MasqueradeBit < 0 || opts.MasqueradeBit > 31 {
		return opts, fmt.Errorf("ipvs: masquerade bit %d out of range 0..31", opts.MasqueradeBit)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	for _, f := range opts.SchedulerFlags {
		if _, ok := schedulerFlags[f]; !ok {
			return opts, fmt.Errorf("ipvs: unknown scheduler flag %q", f)
		}
	}
	return opts, nil
}

// Reconfigure takes the settings of opts that can change while the
// proxier runs and makes the next Apply full, so that the rules, sets and
// virtual servers are compared with them: Scheduler, SchedulerFlags,
// GracePeriod, NodePortCIDRs, NodePortPrimary, ClusterCIDRs,
// MasqueradeAll, MasqueradeBit, the connection timeouts (set now; zero
// keeps the value the kernel has), StrictARP and KeepIPv6Forwarding (the
// sysctls are set now, never undone, as by New). The others keep the
// values New was given: they chose the link, the tools, the families and
// how pods are told (Interface, Variant, IPv6, LockWait, NodePodCIDRs,
// PodInterface), and who logs and counts. A bad value changes nothing.
func (p *Proxier) Reconfigure(opts Options) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	next := p.opts
	next.Scheduler, next.SchedulerFlags, next.GracePeriod = opts.Scheduler, opts.SchedulerFlags, opts.GracePeriod
	next.NodePortCIDRs, next.NodePortPrimary, next.ClusterCIDRs = opts.NodePortCIDRs, opts.NodePortPrimary, opts.ClusterCIDRs
	next.MasqueradeAll, next.MasqueradeBit = opts.MasqueradeAll, opts.MasqueradeBit
	next.TCPTimeout, next.TCPFinTimeout, next.UDPTimeout = opts.TCPTimeout, opts.TCPFinTimeout, opts.UDPTimeout
	next.StrictARP, next.KeepIPv6Forwarding = opts.StrictARP, opts.KeepIPv6Forwarding
	next, err := next.withDefaults()
	if err != nil {
		return err
	}
	prev := p.opts
	if next.TCPTimeout != prev.TCPTimeout || next.TCPFinTimeout != prev.TCPFinTimeout || next.UDPTimeout != prev.UDPTimeout {
		if err := p.k.SetTimeouts(next.TCPTimeout, next.TCPFinTimeout, next.UDPTimeout); err != nil {
			return err
		}
	}
	p.opts, p.synced = next, false
	if next.Kernel == nil {
		if err := sysctl.Ensure(next.sysctls()); err != nil {
			p.sysctlErr = err
			p.log.Warn("some sysctls could not be set", "err", err)
		}
	}
	return nil
}

// sysctls are the kernel parameters that the settings a reload may
// change need (see Reconfigure).
func (opts Options) sysctls() map[string]string {
	want := map[string]string{}
	if opts.IPv6 && !opts.KeepIPv6Forwarding {
		want["net/ipv6/conf/all/forwarding"] = "1"
	}
	if opts.StrictARP {
		want["net/ipv4/conf/all/arp_ignore"] = "1"
		want["net/ipv4/conf/all/arp_announce"] = "2"
	}
	return want
}

// newSysctls are the kernel parameters New sets on a kernel of release:
// those IPVS needs and those of the settings (sysctls).
func (opts Options) newSysctls(release string) map[string]string {
	want := map[string]string{
		"net/ipv4/vs/conntrack":                 "1", // NAT with conntrack, so iptables SNAT and REJECT see IPVS flows
		"net/ipv4/vs/expire_nodest_conn":        "1", // drop connections to deleted real servers at once
		"net/ipv4/vs/expire_quiescent_template": "1", // persistence does not pin clients to weight-0 servers
		"net/ipv4/ip_forward":                   "1",
	}
	if connReuseWorkaround(release) {
		want["net/ipv4/vs/conn_reuse_mode"] = "0"
	}
	maps.Copy(want, opts.sysctls())
	return want
}

// SysctlErrors returns the sysctls New could not set, or nil.
