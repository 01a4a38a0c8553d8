package vm_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/vm"
)

// TestAgentIPVS boots one VM and runs test/vm/agentguest there: the agent
// binary (bin/edgeproxy, `make build`) in mode ipvs with the example policy
// modules (bin/modules, `modules/build.sh bin/modules`), real traffic,
// SIGKILL and restart, and the switch to iptables mode.
func TestAgentIPVS(t *testing.T) {
	root, err := vm.RepoRoot()
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
	vm.RunGoTests(t, 12*time.Minute, vm.GoTest{Package: "./test/vm/agentguest"})
}
