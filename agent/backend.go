package agent

import (
	"fmt"
	"log/slog"
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
	case "plan":
		return recorder.New(), nil
	case "iptables":
		return iptables.New(iptablesOptions(cfg, log, reg))
	case "ipvs":
		return newIPVSBackend(cfg, log, reg)
	default:
		return nil, fmt.Errorf("mode %q is not available in this build", cfg.Mode)
	}
}

func iptablesOptions(cfg *config.Config, log *slog.Logger, reg prometheus.Registerer) iptables.Options {
	cidrs := parsePrefixes(splitList(cfg.ClusterCIDR)...)
	ipv6 := false
	for _, p := range cidrs {
		ipv6 = ipv6 || p.Addr().Is6()
	}
	return iptables.Options{
		// IPv6 frontends are programmed (with ip6tables) when the cluster
		// has an IPv6 pod range, i.e. is dual-stack or IPv6-only.
		IPv6:               ipv6,
		MasqueradeBit:      cfg.IPTables.MasqueradeBit,
		LocalhostNodePorts: cfg.IPTables.LocalhostNodePorts,
		ClusterCIDRs:       cidrs,
		MasqueradeAll:      cfg.MasqueradeAll,
		NodePortAddresses:  parsePrefixes(cfg.NodePortAddresses...),
		NodePortPrimary:    slices.Contains(cfg.NodePortAddresses, config.NodePortPrimary),
		LockWait:           cfg.IPTables.LockWait,
		Logger:             log.With("datapath", "iptables"),
		Registerer:         reg,
	}
}

func ipvsOptions(cfg *config.Config, log *slog.Logger, reg prometheus.Registerer) ipvs.Options {
	return ipvs.Options{
		Interface:      cfg.IPVS.Interface,
		Scheduler:      cfg.IPVS.Scheduler,
		SchedulerFlags: cfg.IPVS.SchedulerFlags,
		StrictARP:      cfg.IPVS.StrictARP,
		GracePeriod:    cfg.IPVS.GracePeriod,
		NodePortCIDRs:  parsePrefixes(cfg.NodePortAddresses...),
		ClusterCIDRs:   parsePrefixes(splitList(cfg.ClusterCIDR)...),
		MasqueradeAll:  cfg.MasqueradeAll,
		MasqueradeBit:  cfg.IPTables.MasqueradeBit,
		TCPTimeout:     cfg.IPVS.TCPTimeout,
		TCPFinTimeout:  cfg.IPVS.TCPFinTimeout,
		UDPTimeout:     cfg.IPVS.UDPTimeout,
		Registerer:     reg,
		Logger:         log.With("datapath", "ipvs"),
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
