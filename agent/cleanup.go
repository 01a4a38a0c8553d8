package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

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
	switch err := cleanupIPVS(ctx, cfg, log); {
	case errors.Is(err, ipvs.ErrNoIPVS):
		log.Info("IPVS is not usable here; no IPVS objects to remove", "reason", err)
	case err != nil:
		errs = append(errs, fmt.Errorf("ipvs: %w", err))
	default:
		log.Info("removed edgeproxy's IPVS virtual servers, addresses and sets")
	}
	if err := iptables.CleanupAll(ctx, log); err != nil {
		errs = append(errs, fmt.Errorf("iptables: %w", err))
	} else {
		log.Info("removed edgeproxy's iptables chains and rules")
	}
	return errors.Join(errs...)
}
