package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/datapath/iptables"
	"github.com/edgeproxy/edgeproxy/datapath/ipvs"
)

// Cleanup removes every kernel object any edgeproxy mode created, whatever
// mode cfg names: switching modes or uninstalling must leave nothing behind.
// It works without a Proxier, so it also clears the state a Proxier refuses
// to start on (our chains under both iptables backends).
func Cleanup(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	var errs []error
	// IPVS mode first: its cleanup removes its own jumps and chains.
	if p, err := ipvs.New(ipvsOptions(cfg, log, prometheus.NewRegistry())); err != nil {
		log.Info("IPVS is not usable here; no IPVS objects to remove", "reason", err)
	} else {
		if err := p.Cleanup(ctx); err != nil {
			errs = append(errs, fmt.Errorf("ipvs: %w", err))
		} else {
			log.Info("removed edgeproxy's IPVS virtual servers, addresses and sets")
		}
		p.Close()
	}
	if err := iptables.CleanupAll(ctx, log); err != nil {
		errs = append(errs, fmt.Errorf("iptables: %w", err))
	} else {
		log.Info("removed edgeproxy's iptables chains and rules")
	}
	return errors.Join(errs...)
}
