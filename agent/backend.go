package agent

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/iptables"
	"github.com/edgeproxy/edgeproxy/datapath/recorder"
)

// NewBackend builds the datapath backend for cfg.Mode.
func NewBackend(cfg *config.Config, log *slog.Logger, reg prometheus.Registerer) (datapath.Backend, error) {
	switch cfg.Mode {
	case "plan":
		return recorder.New(), nil
	case "iptables":
		return iptables.New(iptablesOptions(cfg, log, reg))
	default:
		return nil, fmt.Errorf("mode %q is not available in this build", cfg.Mode)
	}
}

func iptablesOptions(cfg *config.Config, log *slog.Logger, reg prometheus.Registerer) iptables.Options {
	return iptables.Options{
		MasqueradeBit:      cfg.IPTables.MasqueradeBit,
		LocalhostNodePorts: cfg.IPTables.LocalhostNodePorts,
		ClusterCIDRs:       parsePrefixes(splitList(cfg.ClusterCIDR)...),
		MasqueradeAll:      cfg.MasqueradeAll,
		NodePortAddresses:  parsePrefixes(cfg.NodePortAddresses...),
		LockWait:           cfg.IPTables.LockWait,
		Logger:             log.With("datapath", "iptables"),
		Registerer:         reg,
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
