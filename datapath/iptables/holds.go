package iptables

import (
	"context"
	"fmt"

	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// HoldsRules reports whether the kernel already holds this datapath's
// dispatch chain in any family, e.g. left by an earlier run of the agent.
// A node that has just rebooted holds none: the agent then programs its
// last known state at once instead of waiting for the API server.
func (p *Proxier) HoldsRules(ctx context.Context) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range p.fams {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		ok, err := f.ipt.ChainExists(xtables.NAT, chainServices)
		if err != nil {
			return false, fmt.Errorf("iptables: look for chain %s: %w", chainServices, err)
		}
		if ok {
			return true, nil
		}
	}
	return false, nil
}
