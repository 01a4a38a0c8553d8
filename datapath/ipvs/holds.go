package ipvs

import "context"

// HoldsRules reports whether the kernel already holds iptables rules of
// this datapath, e.g. left by an earlier run of the agent. A node that has
// just rebooted holds none: the agent then programs its last known state at
// once instead of waiting for the API server.
func (p *Proxier) HoldsRules(ctx context.Context) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, err := p.ipt.countRules(ctx)
	if err != nil {
		return false, err
	}
	return n > 0, nil
}
