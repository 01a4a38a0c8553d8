package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/iptables"
	"github.com/edgeproxy/edgeproxy/datapath/ipvs"
	"github.com/edgeproxy/edgeproxy/datapath/nftables"
	"github.com/edgeproxy/edgeproxy/datapath/recorder"
	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// NewBackend builds the datapath backend for cfg.Mode.
func NewBackend(cfg *config.Config, log *slog.Logger, reg prometheus.Registerer) (datapath.Backend, error) {
	switch cfg.Mode {
	case config.ModePlan:
		return recorder.New(), nil
	case config.ModeIPTables:
		return iptables.New(iptablesOptions(cfg, log, reg))
	case config.ModeIPVS:
		return newIPVSBackend(cfg, log, reg)
	case config.ModeNFTables:
		return newNFTablesBackend(cfg, log, reg)
	default:
		return nil, fmt.Errorf("mode %q is not available in this build", cfg.Mode)
	}
}

func iptablesOptions(cfg *config.Config, log *slog.Logger, reg prometheus.Registerer) iptables.Options {
	o := iptablesSettings(cfg, log)
	// IPv6 frontends are programmed (with ip6tables) where IPv6 works, as
	// kube-proxy runs its dual-stack proxier.
	o.IPv6 = proxyIPv6(cfg.IPTables.LockWait, log)
	o.LockWait = cfg.IPTables.LockWait
	o.Logger, o.Registerer = log.With("datapath", "iptables"), reg
	return o
}

// newNFTablesBackend builds nftables mode's Proxier once the kernel has
// passed its probe: a kernel without an expression the mode writes is
// refused at start, by name, not at the first apply.
func newNFTablesBackend(cfg *config.Config, log *slog.Logger, reg prometheus.Registerer) (datapath.Backend, error) {
	p, err := nftables.New(nftablesOptions(cfg, log, reg))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Probe(ctx); err != nil {
		_ = p.Close()
		return nil, fmt.Errorf("mode nftables: %w", err)
	}
	return p, nil
}

// nftablesOptions are the options of nftables mode.
func nftablesOptions(cfg *config.Config, log *slog.Logger, reg prometheus.Registerer) nftables.Options {
	o := nftablesSettings(cfg, log)
	// IPv6 Services are proxied where the kernel has IPv6 on, as in the
	// other modes; nf_tables' ip6 family needs no ip6tables.
	o.IPv6 = true
	if err := ipv6Supported("/proc", func() error { return nil }); err != nil {
		log.Info("IPv6 Services are not proxied", "why", err)
		o.IPv6 = false
	}
	o.Logger, o.Registerer = log.With("datapath", "nftables"), reg
	return o
}

// nftablesSettings are the options of nftables mode that cfg sets and a
// reload may change (nftables.Proxier.Reconfigure).
func nftablesSettings(cfg *config.Config, log *slog.Logger) nftables.Options {
	pods := detectLocal(cfg, log)
	return nftables.Options{
		// As in iptables mode (see routesIPv6).
		KeepIPv6Forwarding: !routesIPv6(cfg, log),
		MasqueradeBit:      cfg.IPTables.MasqueradeBit,
		ClusterCIDRs:       pods.cidrs,
		NodePodCIDRs:       pods.node,
		PodInterface:       pods.iface,
		MasqueradeAll:      cfg.MasqueradeAll,
		TCPBeLiberal:       cfg.Conntrack.TCPBeLiberal,
		NodePortAddresses:  parsePrefixes(cfg.NodePortAddresses...),
		// Unset, it is [primary] in this mode, as kube-proxy's nftables
		// mode defaults it (platformApplyDefaults): NodePorts answer on
		// the Node's InternalIPs only, not on every local address.
		NodePortPrimary: len(cfg.NodePortAddresses) == 0 || slices.Contains(cfg.NodePortAddresses, config.NodePortPrimary),
	}
}

// iptablesSettings are the options of iptables mode that cfg sets and a
// reload may change (iptables.Proxier.Reconfigure).
func iptablesSettings(cfg *config.Config, log *slog.Logger) iptables.Options {
	pods := detectLocal(cfg, log)
	return iptables.Options{
		KeepIPv6Forwarding: !routesIPv6(cfg, log),
		MasqueradeBit:      cfg.IPTables.MasqueradeBit,
		LocalhostNodePorts: cfg.IPTables.LocalhostNodePorts,
		ClusterCIDRs:       pods.cidrs,
		NodePodCIDRs:       pods.node,
		PodInterface:       pods.iface,
		MasqueradeAll:      cfg.MasqueradeAll,
		NodePortAddresses:  parsePrefixes(cfg.NodePortAddresses...),
		NodePortPrimary:    slices.Contains(cfg.NodePortAddresses, config.NodePortPrimary),
		TCPBeLiberal:       cfg.Conntrack.TCPBeLiberal,
	}
}

// reconfigureBackend gives the backend next's datapath settings when
// they differ from prev's, and reports whether it did: the backend's next
// apply rewrites its rules with them. kube-proxy restarts for that; the
// agent reloads without a restart. A backend the caller supplied (tests,
// plan mode) takes none.
func reconfigureBackend(b datapath.Backend, prev, next *config.Config, log *slog.Logger) (bool, error) {
	// Compared quietly; only settings that changed are built again with
	// the log, which then says what they mean (e.g. no clusterCIDR).
	quiet := slog.New(slog.DiscardHandler)
	switch b := b.(type) {
	case *iptables.Proxier:
		if reflect.DeepEqual(iptablesSettings(prev, quiet), iptablesSettings(next, quiet)) {
			return false, nil
		}
		return true, b.Reconfigure(iptablesSettings(next, log))
	case *nftables.Proxier:
		if reflect.DeepEqual(nftablesSettings(prev, quiet), nftablesSettings(next, quiet)) {
			return false, nil
		}
		return true, b.Reconfigure(nftablesSettings(next, log))
	case *ipvsBackend:
		if reflect.DeepEqual(ipvsSettings(prev, quiet), ipvsSettings(next, quiet)) {
			return false, nil
		}
		now := ipvsSettings(next, log)
		if err := b.Proxier.Reconfigure(now); err != nil {
			return true, err
		}
		b.ct.SetNodePortAddresses(now.NodePortCIDRs)
		return true, nil
	}
	return false, nil
}

// podDetector is how the datapaths tell traffic from pods: by one of
// these (kube-proxy's local-traffic detector).
type podDetector struct {
	cidrs []netip.Prefix // the source is in one (ClusterCIDR)
	node  bool           // the source is in the Node's spec.podCIDRs (NodeCIDR)
	iface string         // it arrives on this interface, "prefix+" by prefix
}

// detectLocal turns detectLocalMode into the datapaths' options, as
// kube-proxy's getLocalDetectors picks the detector.
func detectLocal(cfg *config.Config, log *slog.Logger) podDetector {
	switch cfg.DetectLocalMode {
	case config.LocalModeNodeCIDR:
		return podDetector{node: true}
	case config.LocalModeBridgeInterface:
		return podDetector{iface: cfg.DetectLocal.BridgeInterface}
	case config.LocalModeInterfaceNamePrefix:
		return podDetector{iface: cfg.DetectLocal.InterfaceNamePrefix + "+"}
	}
	cidrs := parsePrefixes(splitList(cfg.ClusterCIDR)...)
	if len(cidrs) == 0 {
		log.Info("detectLocalMode ClusterCIDR without clusterCIDR: no traffic is told from pods; ClusterIP traffic is masqueraded only with masqueradeAll")
	}
	return podDetector{cidrs: cidrs}
}

// proxyIPv6 reports whether IPv6 Services are proxied (both modes). It is
// kube-proxy's decision (platformCheckSupported): the kernel has IPv6 on
// and ip6tables works, whatever addresses the node has now, so an IPv6
// Service on a node whose global IPv6 address arrives later (SLAAC) or
// never is programmed all the same. Decided once at start, as kube-proxy.
func proxyIPv6(lockWait time.Duration, log *slog.Logger) bool {
	err := ipv6Supported("/proc", func() error { return ip6tablesWorks(lockWait) })
	if err != nil {
		log.Info("IPv6 Services are not proxied", "why", err)
		return false
	}
	return true
}

// routesIPv6 reports whether the node routes IPv6 already, as far as
// edgeproxy can tell: it has a global IPv6 address or clusterCIDR an IPv6
// range. Only then does the datapath turn IPv6 forwarding on (see
// KeepIPv6Forwarding in the datapaths' Options): elsewhere that would
// make the node ignore Router Advertisements, and a node whose IPv6
// comes by SLAAC would lose it.
func routesIPv6(cfg *config.Config, log *slog.Logger) bool {
	addrs, err := interfaceAddrs()
	if err != nil {
		log.Warn("cannot list the node's addresses; IPv6 forwarding is left as it is", "err", err)
	}
	return hasIPv6(parsePrefixes(splitList(cfg.ClusterCIDR)...), addrs)
}

// hasIPv6 reports whether clusterCIDRs hold an IPv6 range or addrs a
// global IPv6 address (loopback and link-local ones do not count: every
// kernel has them).
func hasIPv6(clusterCIDRs []netip.Prefix, addrs []netip.Addr) bool {
	for _, p := range clusterCIDRs {
		if p.Addr().Is6() && !p.Addr().Is4In6() {
			return true
		}
	}
	return slices.ContainsFunc(addrs, func(a netip.Addr) bool {
		return a.Is6() && !a.Is4In6() && !a.IsLoopback() && !a.IsLinkLocalUnicast()
	})
}

// interfaceAddrs lists the addresses of this network namespace.
func interfaceAddrs() ([]netip.Addr, error) {
	list, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("list interface addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range list {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, ip)
			}
		}
	}
	return out, nil
}

// ipv6Supported returns why IPv6 cannot be proxied, or nil: the kernel
// under proc has no IPv6 (no net/if_inet6), IPv6 is turned off
// (net.ipv6.conf.all.disable_ipv6), or ip6tables fails.
func ipv6Supported(proc string, ip6tables func() error) error {
	if _, err := os.Stat(filepath.Join(proc, "net/if_inet6")); err != nil {
		return fmt.Errorf("the kernel has no IPv6: %w", err)
	}
	if b, err := os.ReadFile(filepath.Join(proc, "sys/net/ipv6/conf/all/disable_ipv6")); err == nil && strings.TrimSpace(string(b)) == "1" {
		return errors.New("IPv6 is disabled (net.ipv6.conf.all.disable_ipv6=1)")
	}
	if err := ip6tables(); err != nil {
		return fmt.Errorf("ip6tables does not work: %w", err)
	}
	return nil
}

// ip6tablesWorks lists nat POSTROUTING with ip6tables, as kube-proxy
// checks that a family's iptables is present: the tools are installed
// and the kernel has the IPv6 nat table.
func ip6tablesWorks(lockWait time.Duration) error {
	x, err := xtables.Open(xtables.Auto, datapath.IPv6, lockWait)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), lockWait+10*time.Second)
	defer cancel()
	_, err = x.Run(ctx, "-t", xtables.NAT, "-S", "POSTROUTING")
	return err
}

func ipvsOptions(cfg *config.Config, log *slog.Logger, reg prometheus.Registerer) ipvs.Options {
	o := ipvsSettings(cfg, log)
	// Both families where IPv6 works, as in iptables mode.
	o.IPv6 = proxyIPv6(cfg.IPTables.LockWait, log)
	o.Interface, o.LockWait = cfg.IPVS.Interface, cfg.IPTables.LockWait
	o.Logger, o.Registerer = log.With("datapath", "ipvs"), reg
	return o
}

// ipvsSettings are the options of IPVS mode that cfg sets and a reload
// may change (ipvs.Proxier.Reconfigure).
func ipvsSettings(cfg *config.Config, log *slog.Logger) ipvs.Options {
	pods := detectLocal(cfg, log)
	return ipvs.Options{
		KeepIPv6Forwarding: !routesIPv6(cfg, log),
		Scheduler:          cfg.IPVS.Scheduler,
		SchedulerFlags:     cfg.IPVS.SchedulerFlags,
		StrictARP:          cfg.IPVS.StrictARP,
		GracePeriod:        cfg.IPVS.GracePeriod,
		NodePortCIDRs:      parsePrefixes(cfg.NodePortAddresses...),
		NodePortPrimary:    slices.Contains(cfg.NodePortAddresses, config.NodePortPrimary),
		ClusterCIDRs:       pods.cidrs,
		NodePodCIDRs:       pods.node,
		PodInterface:       pods.iface,
		MasqueradeAll:      cfg.MasqueradeAll,
		MasqueradeBit:      cfg.IPTables.MasqueradeBit,
		TCPTimeout:         cfg.IPVS.TCPTimeout,
		TCPFinTimeout:      cfg.IPVS.TCPFinTimeout,
		UDPTimeout:         cfg.IPVS.UDPTimeout,
	}
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
