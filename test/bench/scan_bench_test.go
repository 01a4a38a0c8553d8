package bench

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
)

// BenchmarkScan is the cost of one ground-truth read of a rule set saved
// by a run (EPBENCH_RULESET=path/ruleset.txt), per backend.
func BenchmarkScan(b *testing.B) {
	gate.Root(b)
	path := os.Getenv("EPBENCH_RULESET")
	if path == "" {
		b.Skip("set EPBENCH_RULESET to a ruleset.txt that epbench saved")
	}
	rules, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	for _, backend := range []string{"legacy", "nft"} {
		b.Run(backend, func(b *testing.B) {
			ns, err := NewNetns("scan-" + backend)
			if err != nil {
				b.Fatal(err)
			}
			defer ns.Close()
			err = ns.Do(func() error {
				cmd := exec.Command("iptables-" + backend + "-restore")
				cmd.Stdin = strings.NewReader(string(rules))
				out, err := cmd.CombinedOutput()
				if err != nil {
					b.Fatalf("%v: %s", err, out)
				}
				return nil
			})
			k, err := ns.OpenKernel(backend)
			if err != nil {
				b.Fatal(err)
			}
			defer k.Close()
			n := 0
			for b.Loop() {
				n = 0
				if err := k.Scan(func(Dest) { n++ }); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n), "dests")
		})
	}
}
