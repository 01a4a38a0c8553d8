package ipvs

import "context"

// HoldsRules reports whether the kernel already holds iptables rules of
// this datapath, e.g. left by an earlier run of the agent. A node that has
// just rebooted holds none: the agent then programs its last known state at
// once instead of waiting for the API server.
func (p *Proxier) HoldsRules(ctx context.Context) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, t := range p.ipt {
		n, err := t.countRules(ctx)
		if err != nil {
			return false, err
		}
		if n > 0 {
			return true, nil
		}
	}
	return false, nil
}

// Programs reports whether the virtual server k is one this datapath
// programs (added, or adopted when it found it with the same key, as it
// does kube-proxy's on a takeover).
func (p *Proxier) Programs(k Key) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.applied[k]
	return ok
}
