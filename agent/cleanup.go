package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/datapath/iptables"
	"github.com/edgeproxy/edgeproxy/datapath/ipvs"
	"github.com/edgeproxy/edgeproxy/datapath/nftables"
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
	if _, err := cleanupNFTables(ctx, false); err != nil {
		errs = append(errs, err)
	} else {
		log.Info("removed edgeproxy's nftables tables")
	}
	return errors.Join(errs...)
}

// cleanupNFTables removes nftables mode's tables (ip and ip6 edgeproxy)
// with the datapath's own Cleanup, which succeeds when there is none.
// ifPresent first lists the table names and writes nothing when neither
// is there: a node that never ran nftables mode sees no transaction. It
// reports whether it removed something it saw.
func cleanupNFTables(ctx context.Context, ifPresent bool) (bool, error) {
	// NoSysctls: finding or removing the tables must not turn forwarding
	// on (a node in iptables mode may keep IPv6 forwarding off).
	p, err := nftables.New(nftables.Options{IPv6: true, NoConntrack: true, NoSysctls: true})
	if err != nil {
		return false, err
	}
	defer p.Close()
	held, err := p.HoldsRules(ctx)
	if ifPresent && (err != nil || !held) {
		return false, err
	}
	return held, p.Cleanup(ctx)
}
