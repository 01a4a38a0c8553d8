// Package recorder is the "plan" datapath: it validates and keeps each plan
// it is given and touches nothing in the kernel. The agent serves the kept
// plan on /debug/plan; `edgeproxy plan` prints it.
package recorder

import (
	"context"
	"sync"

	"github.com/edgeproxy/edgeproxy/datapath"
)

// Recorder implements datapath.Backend without side effects.
type Recorder struct {
	mu      sync.Mutex
	last    *datapath.Plan
	applied int
}

// New returns an empty recorder.
func New() *Recorder { return &Recorder{} }

// Name returns "plan".
func (r *Recorder) Name() string { return "plan" }

// Apply validates p and keeps it.
func (r *Recorder) Apply(_ context.Context, p *datapath.Plan) error {
	if err := p.Validate(); err != nil {
		return err
	}
	r.mu.Lock()
	r.last = p
	r.applied++
	r.mu.Unlock()
	return nil
}

// Cleanup has nothing to remove.
func (r *Recorder) Cleanup(context.Context) error { return nil }

// Last returns the last plan applied, or nil, and how many were applied.
func (r *Recorder) Last() (*datapath.Plan, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last, r.applied
}
