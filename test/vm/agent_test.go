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
// EDGEPROXY_VM_KNOWN_BUGS=1 also runs the subtests that fail on known agent
// bugs (today: starting iptables mode over IPVS mode's objects).
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
	g := GoTest{Package: "./test/vm/agentguest"}
	// Subtests that fail on known agent bugs are skipped unless asked for.
	if os.Getenv("EDGEPROXY_VM_KNOWN_BUGS") == "1" {
		g.Args = append(g.Args, "-knownbugs")
	}
	RunGoTests(t, 7*time.Minute, g)
}
