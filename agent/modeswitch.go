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

// cleanupOtherMode removes what the other kernel mode left on this node, so
// a node switched between iptables and IPVS mode does not keep serving (or
// blocking) with stale objects. It runs before the first sync; errors are
// logged, not fatal: the mode in force must still start.
func cleanupOtherMode(ctx context.Context, cfg *config.Config, log *slog.Logger) {
	switch cfg.Mode {
	case config.ModeIPVS:
		// iptables mode's chains; IPVS mode's own EP-IPVS- chains are not
		// iptables mode's and stay.
		if err := iptables.CleanupAll(ctx, log); err != nil {
			log.Warn("could not remove iptables mode's rules left from an earlier run", "err", err)
		}
	case config.ModeIPTables:
		// IPVS mode always creates its dummy link: without it there is
		// nothing to remove, and ip_vs is not loaded just to look.
		if _, err := netlink.LinkByName(cfg.IPVS.Interface); err != nil {
			return
		}
		if err := cleanupIPVS(ctx, cfg, log); err != nil {
			log.Warn("could not remove IPVS mode's objects left from an earlier run", "err", err)
			return
		}
		log.Info("removed IPVS mode's virtual servers, addresses, sets and rules left from an earlier run")
	}
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
