package agent

import (
	"context"
	"time"
)

// rulesHolder is implemented by backends that can tell whether the kernel
// already holds their rules (datapath/iptables, datapath/ipvs).
type rulesHolder interface {
	HoldsRules(ctx context.Context) (bool, error)
}

// kernelHoldsNoRules reports whether the kernel holds none of the
// backend's rules: the node has rebooted (or been cleaned up), so nothing
// serves the Services until the agent programs something. A backend that
// cannot tell, or an error, answers false: the agent then keeps the
// careful path (wait offline.startTimeout for the API server).
func (a *Agent) kernelHoldsNoRules(ctx context.Context) bool {
	h, ok := a.backend.(rulesHolder)
	if !ok {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	holds, err := h.HoldsRules(ctx)
	if err != nil {
		a.log.Warn("cannot tell whether the kernel holds our rules; waiting for the API server first", "err", err)
		return false
	}
	return !holds
}

// startAfterReboot programs the last known state at once when the kernel
// holds none of our rules and a verified snapshot exists: waiting for the
// API server would leave the node's Services unanswered (for up to
// offline.startTimeout when the API server is unreachable). It must run
// before the source starts, so that objects listed from the API server
// replace the snapshot's and never the other way round; the source's list
// then converges in the offline reconcile's coalesced sync.
func (a *Agent) startAfterReboot(ctx context.Context) bool {
	if a.api == nil || a.Config().Offline.StartTimeout <= 0 || a.Config().StateDir == "" {
		return false
	}
	if !a.kernelHoldsNoRules(ctx) {
		return false
	}
	return a.startFromSnapshot("the kernel holds none of our rules (a reboot)")
}
