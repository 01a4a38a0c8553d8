package vm

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/test/gate"
)

// TestAgentIPVS boots one VM and runs test/vm/agentguest there: the agent
// binary (bin/edgeproxy, `make build`) in mode ipvs with the example policy
// modules (bin/modules, `modules/build.sh bin/modules`), real traffic,
// SIGKILL and restart, and the switch to iptables mode.
func TestAgentIPVS(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	// Stat the artifacts here, on the host, so that a rebuilt binary or
	// module invalidates go test's cached result.
	for _, f := range []string{"bin/edgeproxy", "bin/modules/weighted.wasm", "bin/modules/scheduler.wasm"} {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			gate.Skip(t, "needs "+f+" (make build; modules/build.sh bin/modules)")
		}
	}
	RunGoTests(t, 7*time.Minute, GoTest{Package: "./test/vm/agentguest"})
}
