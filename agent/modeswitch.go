package agent

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/datapath/iptables"
	"github.com/edgeproxy/edgeproxy/datapath/ipvs"
	"github.com/edgeproxy/edgeproxy/datapath/kubeproxy"
)

// cleanupOtherMode removes, before the first sync, what the other xtables
// mode left on this node, so a node switched between iptables and IPVS
// mode does not keep serving (or blocking) with stale objects; errors are
// logged, not fatal: the mode in force must still start. What nftables
// mode left, or what it finds of the other two, goes after the first sync
// instead (cleanupOtherModeAfterSync).
func cleanupOtherMode(ctx context.Context, cfg *config.Config, log *slog.Logger) {
	switch cfg.Mode {
	case config.ModeIPVS:
		// iptables mode's chains; IPVS mode's own EP-IPVS- chains are not
		// iptables mode's and stay.
		if err := iptables.CleanupAll(ctx, log); err != nil {
			log.Warn("could not remove iptables mode's rules left from an earlier run", "err", err)
		}
	case config.ModeIPTables:
		cleanupIPVSMode(ctx, cfg, log)
	}
}

// cleanupOtherModeAfterSync removes, once the first sync has put the
// mode's own rules in place, what another mode left when nftables mode
// is one of the two: entering nftables mode, iptables mode's chains and
// IPVS mode's objects; entering iptables or IPVS mode, nftables mode's
// tables. nf_tables and xtables objects live side by side, so the old
// rules answer until the new ones are there: no new connection fails
// across the switch (at one hook and priority the base chain registered
// last comes first, so the rules nftables mode writes at start take
// precedence over iptables' nat chains; the way back, the old nftables
// rules may answer until they go). It reports whether it removed rules
// that may have answered after the first sync: their UDP conntrack
// entries are then swept by a full sync. Errors are logged.
func cleanupOtherModeAfterSync(ctx context.Context, cfg *config.Config, log *slog.Logger) bool {
	switch cfg.Mode {
	case config.ModeNFTables:
		if err := iptables.CleanupAll(ctx, log); err != nil {
			log.Warn("could not remove iptables mode's rules left from an earlier run", "err", err)
		}
		cleanupIPVSMode(ctx, cfg, log)
	case config.ModeIPTables, config.ModeIPVS:
		switch removed, err := cleanupNFTables(ctx, true); {
		case err != nil:
			log.Warn("could not remove nftables mode's tables left from an earlier run", "err", err)
		case removed:
			log.Info("removed nftables mode's tables left from an earlier run")
			return true
		}
	}
	return false
}

// cleanupIPVSMode removes IPVS mode's objects when it ran here. IPVS mode
// always creates its dummy link: without it there is nothing to remove,
// and ip_vs is not loaded just to look.
func cleanupIPVSMode(ctx context.Context, cfg *config.Config, log *slog.Logger) {
	if _, err := netlink.LinkByName(cfg.IPVS.Interface); err != nil {
		return
	}
	if err := cleanupIPVS(ctx, cfg, log); err != nil {
		log.Warn("could not remove IPVS mode's objects left from an earlier run", "err", err)
		return
	}
	log.Info("removed IPVS mode's virtual servers, addresses, sets and rules left from an earlier run")
}

// cleanupIPVS removes IPVS mode's virtual servers, dummy-link addresses,
// sets and rules. It fails with ipvs.ErrNoIPVS when the kernel has no IPVS.
// The virtual servers a kube-proxy in IPVS mode claims (on kube-ipvs0's
// addresses, its NodePorts) stay: on the way back kube-proxy may already
// run, and programs the same keys (kubeproxy.Claims).
func cleanupIPVS(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	o := ipvsOptions(cfg, log, prometheus.NewRegistry())
	leave, err := kubeproxy.Claims(cfg.IPVS.Interface)
	if err != nil {
		log.Warn("reading kube-proxy's IPVS objects; those not read are removed as edgeproxy's", "err", err)
	}
	o.Leave = leave
	p, err := ipvs.New(o)
	if err != nil {
		return err
	}
	defer p.Close()
	return p.Cleanup(ctx)
}
