package agent

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/iptables"
	"github.com/edgeproxy/edgeproxy/datapath/ipvs"
	"github.com/edgeproxy/edgeproxy/datapath/recorder"
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
	default:
		return nil, fmt.Errorf("mode %q is not available in this build", cfg.Mode)
	}
}

func iptablesOptions(cfg *config.Config, log *slog.Logger, reg prometheus.Registerer) iptables.Options {
	cidrs := parsePrefixes(splitList(cfg.ClusterCIDR)...)
	return iptables.Options{
		// IPv6 frontends are programmed (with ip6tables) when the node
		// has an IPv6 address or the cluster an IPv6 pod range, as
		// kube-proxy runs its dual-stack proxier where both work.
		IPv6:               proxyIPv6(cidrs, log),
		MasqueradeBit:      cfg.IPTables.MasqueradeBit,
		LocalhostNodePorts: cfg.IPTables.LocalhostNodePorts,
		ClusterCIDRs:       cidrs,
		MasqueradeAll:      cfg.MasqueradeAll,
		NodePortAddresses:  parsePrefixes(cfg.NodePortAddresses...),
		NodePortPrimary:    slices.Contains(cfg.NodePortAddresses, config.NodePortPrimary),
		LockWait:           cfg.IPTables.LockWait,
		TCPBeLiberal:       cfg.Conntrack.TCPBeLiberal,
		Logger:             log.With("datapath", "iptables"),
		Registerer:         reg,
	}
}

// proxyIPv6 reports whether IPv6 Services are proxied (both modes): the
// node or the cluster has IPv6 (wantIPv6) and ip6tables is installed.
func proxyIPv6(clusterCIDRs []netip.Prefix, log *slog.Logger) bool {
	addrs, err := interfaceAddrs()
	if err != nil {
		log.Warn("cannot list the node's addresses to pick the IP families", "err", err)
	}
	if !wantIPv6(clusterCIDRs, addrs) {
		return false
	}
	if _, err := exec.LookPath("ip6tables-restore"); err != nil {
		log.Warn("the node has IPv6 but ip6tables is missing: IPv6 Services are not proxied", "err", err)
		return false
	}
	return true
}

func ipvsOptions(cfg *config.Config, log *slog.Logger, reg prometheus.Registerer) ipvs.Options {
	cidrs := parsePrefixes(splitList(cfg.ClusterCIDR)...)
	return ipvs.Options{
		// Both families when the node has both, as in iptables mode.
		IPv6:            proxyIPv6(cidrs, log),
		Interface:       cfg.IPVS.Interface,
		Scheduler:       cfg.IPVS.Scheduler,
		SchedulerFlags:  cfg.IPVS.SchedulerFlags,
		StrictARP:       cfg.IPVS.StrictARP,
		GracePeriod:     cfg.IPVS.GracePeriod,
		NodePortCIDRs:   parsePrefixes(cfg.NodePortAddresses...),
		NodePortPrimary: slices.Contains(cfg.NodePortAddresses, config.NodePortPrimary),
		ClusterCIDRs:    cidrs,
		MasqueradeAll:   cfg.MasqueradeAll,
		MasqueradeBit:   cfg.IPTables.MasqueradeBit,
		LockWait:        cfg.IPTables.LockWait,
		TCPTimeout:      cfg.IPVS.TCPTimeout,
		TCPFinTimeout:   cfg.IPVS.TCPFinTimeout,
		UDPTimeout:      cfg.IPVS.UDPTimeout,
		Registerer:      reg,
		Logger:          log.With("datapath", "ipvs"),
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

// wantIPv6 reports whether IPv6 is to be proxied: the cluster has an IPv6
// pod range, or the node a global IPv6 address (loopback and link-local
// addresses do not count: every kernel has them).
func wantIPv6(clusterCIDRs []netip.Prefix, addrs []netip.Addr) bool {
	for _, p := range clusterCIDRs {
		if p.Addr().Is6() {
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
