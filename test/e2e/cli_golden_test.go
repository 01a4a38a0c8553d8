package e2e

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/test/agenttest"
)

var update = flag.Bool("update", false, "rewrite the golden files of the CLI tests from the actual output")

// masks replace what changes from run to run (version, ages, the plan
// generation, loopback ports, module run times) so the rest of the output can be compared.
var masks = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`^edgeproxy \S+  mode`), "edgeproxy <version>  mode"},
	{regexp.MustCompile(`\b[0-9][0-9.hmsµn]* ago\b`), "<age> ago"},
	{regexp.MustCompile(`plan generation: [0-9]+`), "plan generation: <n>"},
	{regexp.MustCompile(`127\.0\.0\.1:[0-9]+`), "127.0.0.1:<port>"},
	{regexp.MustCompile(`"durationNs":[0-9]+`), `"durationNs":<ns>`},
	{regexp.MustCompile(`(?m)^(  \S+ +\S+ +ok +)[0-9a-f]{12}$`), "${1}<sha256>"},
}

func mask(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		for _, m := range masks {
			l = m.re.ReplaceAllString(l, m.with)
		}
		lines[i] = l
	}
	return strings.Join(lines, "\n")
}

// runCLI runs the edgeproxy binary with args and returns its stdout,
// stderr and exit code.
func runCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, agenttest.Binary(t), args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("edgeproxy %s: %v", strings.Join(args, " "), err)
	}
	return o.String(), e.String(), code
}

// golden compares got (masked) with testdata/cli/name.golden, or writes it
// with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	got = mask(got)
	path := filepath.Join("testdata", "cli", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from %s (run with -update to accept):\n--- got\n%s\n--- want\n%s", name, path, got, want)
	}
}

// `edgeproxy status` and `edgeproxy explain` against a running agent that
// reads the manifests in testdata/cli/manifests, compared with golden
// files; and their errors when there is nothing to ask.
func TestCLIGolden(t *testing.T) {
	dir, err := filepath.Abs(filepath.Join("testdata", "cli", "manifests"))
	if err != nil {
		t.Fatal(err)
	}
	mods := moduleDir(t)
	a := agenttest.Start(t, agenttest.Options{Config: fmt.Sprintf(`mode: plan
manifests: %q
nodeName: edge-1
sync: {minPeriod: 100ms, period: 30s}
policy:
  engine: interpreter
  # The default 5ms per call can be missed on a loaded machine, and a
  # failed evaluation is not retried until the service changes.
  timeout: 500ms
  modules:
    - {name: weighted, path: %q}
  chains:
    - name: by-zone
      match: {namespaces: [shop], labels: {app: orders}}
      modules: [{module: weighted, config: {default: 1}}]
`, dir, filepath.Join(mods, "weighted.wasm"))})
	a.WaitPlanLines(converge, []string{
		"TCP  10.96.20.53:53 ClusterIP infra/resolver:dns-tcp -> 10.244.1.53:53 w=1",
		"TCP  10.96.20.10:80 ClusterIP shop/orders:http -> 10.244.1.31:8080 w=4, 10.244.2.32:8080 w=4, 10.244.3.33:8080 w=1",
	})
	server := "--server=" + a.Metrics

	for _, tc := range []struct {
		name string
		args []string
	}{
		{"status", []string{"status", server}},
		{"explain-orders", []string{"explain", server, "shop/orders"}},
		{"explain-plc-gw", []string{"explain", server, "plant/plc-gw"}},
		{"explain-resolver", []string{"explain", server, "infra/resolver"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := runCLI(t, tc.args...)
			if code != 0 {
				t.Fatalf("edgeproxy %s: exit %d: %s", strings.Join(tc.args, " "), code, errOut)
			}
			golden(t, tc.name, strings.ReplaceAll(strings.ReplaceAll(out, dir, "<manifests>"), mods, "<modules>"))
		})
	}

	// Errors go to stderr with a non-zero exit, and say what to do.
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"explain-unknown", []string{"explain", server, "shop/nothing"}},
		{"explain-usage", []string{"explain", server, "orders"}},
		{"status-no-agent", []string{"status", "--server=" + deadAddr(t)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := runCLI(t, tc.args...)
			if code == 0 {
				t.Fatalf("edgeproxy %s: exit 0, want an error; stdout:\n%s", strings.Join(tc.args, " "), out)
			}
			golden(t, tc.name, fmt.Sprintf("exit %d\n%s", code, errOut))
		})
	}
}

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
