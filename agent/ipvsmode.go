package agent

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/conntrack"
	"github.com/edgeproxy/edgeproxy/datapath/ipvs"
)

// ipvsBackend is IPVS mode: the ipvs Proxier, followed after each
// successful apply by the same targeted UDP conntrack cleanup the iptables
// datapath runs (a UDP real server is deleted at once, and its flows must
// not stay pinned to it).
type ipvsBackend struct {
	*ipvs.Proxier
	ct  *conntrack.Cleaner
	log *slog.Logger
}

func newIPVSBackend(cfg *config.Config, log *slog.Logger, reg prometheus.Registerer) (*ipvsBackend, error) {
	p, err := ipvs.New(ipvsOptions(cfg, log, reg))
	if err != nil {
		return nil, err
	}
	ct, err := conntrack.New(conntrack.Options{
		Logger: log.With("datapath", "conntrack"), Registerer: reg,
		NodePortAddresses: parsePrefixes(cfg.NodePortAddresses...),
	})
	if err != nil {
		p.Close()
		return nil, fmt.Errorf("conntrack: %w", err)
	}
	return &ipvsBackend{Proxier: p, ct: ct, log: log.With("datapath", "ipvs")}, nil
}

// Apply programs p, then clears stale UDP flows. A failed cleanup is
// reported but does not fail the apply: the rules are right, and the next
// sync retries the cleanup.
func (b *ipvsBackend) Apply(ctx context.Context, p *datapath.Plan) error {
	if err := b.Proxier.Apply(ctx, p); err != nil {
		return err
	}
	if _, err := b.ct.Reconcile(ctx, p.Frontends, p.Full); err != nil {
		b.log.Warn("conntrack cleanup after the IPVS apply failed; retried next sync", "err", err)
	}
	return nil
}
