package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/edgeproxy/edgeproxy/datapath"
)

// holder is a datapath that answers HoldsRules as told.
type holder struct {
	flaky
	holds bool
	err   error
}

func (h *holder) HoldsRules(context.Context) (bool, error) { return h.holds, h.err }

// Only a backend that says for sure that the kernel holds none of its rules
// sends the agent down the reboot path; one that cannot tell, or fails to,
// keeps the careful wait for the API server.
func TestKernelHoldsNoRules(t *testing.T) {
	for _, tc := range []struct {
		name    string
		backend datapath.Backend
		want    bool
	}{
		{"rules in the kernel", &holder{holds: true}, false},
		{"no rules in the kernel", &holder{holds: false}, true},
		{"cannot look", &holder{err: errors.New("iptables: locked")}, false},
		{"backend cannot tell", &flaky{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &Agent{backend: tc.backend, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			if got := a.kernelHoldsNoRules(context.Background()); got != tc.want {
				t.Errorf("kernelHoldsNoRules = %v, want %v", got, tc.want)
			}
		})
	}
}

// Without an API server (a manifest directory) there is no reboot path:
// the manifests are their own last known state.
func TestNoRebootPathWithoutAPIServer(t *testing.T) {
	h := &holder{holds: false}
	a := startAgent(t, h, t.TempDir())
	if a.startAfterReboot(context.Background()) {
		t.Error("startAfterReboot took the snapshot path without an API server")
	}
}
