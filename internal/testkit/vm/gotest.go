package vm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
)

// Guest lets the calling test run only inside the VM. On the host it skips
// (a plain skip, also under EDGEPROXY_REQUIRE_ALL: the same test runs in
// the guest through RunGoTests, so no tier is lost).
func Guest(t testing.TB) {
	t.Helper()
	if !InGuest() {
		t.Skip("runs inside the test VM; test/vm's TestGuestPackages runs it there")
	}
}

// GoTest is one package whose test binary runs in the guest.
type GoTest struct {
	// Package is the package's directory relative to the repository root,
	// e.g. "./datapath/ipvs" or "./test/vm/agentguest": either Go module
	// of the repository (the main one or test/'s).
	Package string
	// Args are extra test flags, e.g. "-test.run=Kernel".
	Args []string
	// Check, when set, judges the binary's output after a zero exit: a
	// guest test that skipped, or a -test.run that matched nothing, also
	// exits 0.
	Check func(out []byte) error
}

func (g GoTest) name() string {
	return strings.ReplaceAll(strings.Trim(strings.TrimPrefix(g.Package, "./"), "/"), "/", "_")
}

// RunGoTests builds each package's test binary on the host (CGO_ENABLED=0,
// `go test -c` in the package's directory, so in its own module), boots one VM, runs every binary there with -test.v in
// order, and reports each package as a subtest of t that fails when its
// binary did. EDGEPROXY_REQUIRE_ALL is passed through, so a guest test
// that would skip fails in CI. timeout bounds the whole run.
func RunGoTests(t *testing.T, timeout time.Duration, tests ...GoTest) {
	t.Helper()
	RunGoTestsIn(t, t.TempDir(), timeout, tests...)
}

// RunGoTestsIn is RunGoTests with the directory shared writable with the
// guest chosen by the caller (an absolute path without spaces or quotes,
// such as t.TempDir()): the host and the guest tests can exchange files
// there while the VM runs. The test binaries and their output go there
// too.
func RunGoTestsIn(t *testing.T, dir string, timeout time.Duration, tests ...GoTest) {
	t.Helper()
	if err := Check(); err != nil {
		gate.Skip(t, err.Error())
	}
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if err := touchSources(root, tests); err != nil {
		t.Fatal(err)
	}
	var script strings.Builder
	script.WriteString("ulimit -c 0\n")
	for _, g := range tests {
		bin := filepath.Join(dir, g.name()+".test")
		cmd := exec.Command("go", "test", "-c", "-o", bin, ".")
		cmd.Dir = filepath.Join(root, g.Package)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("vm: build %s: %v\n%s", g.Package, err, out)
		}
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("vm: %s has no tests to build: %v", g.Package, err)
		}
		// Each binary runs in its package directory, as `go test` would.
		// The binary's own timeout fires first, so that a hung test
		// prints its goroutines instead of the VM being killed silently.
		inner := max(timeout-time.Minute, timeout*3/4)
		args := []string{"-test.v", "-test.timeout=" + inner.String()}
		args = append(args, g.Args...)
		quoted := make([]string, len(args))
		for i, a := range args {
			quoted[i] = shellQuote(a)
		}
		fmt.Fprintf(&script, "(cd %s && %s %s) >%s.out 2>&1; echo $? >%s.exit\n",
			shellQuote(filepath.Join(root, g.Package)), shellQuote(bin), strings.Join(quoted, " "),
			shellQuote(filepath.Join(dir, g.name())), shellQuote(filepath.Join(dir, g.name())))
	}
	var env []string
	if gate.RequireAll() {
		env = append(env, "EDGEPROXY_REQUIRE_ALL=1")
	}
	res, err := Run(context.Background(), Options{Dir: dir, Script: script.String(), Env: env, Timeout: timeout, HostPaths: []string{root}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("vm: waited %s for another VM, booted in %s, ran in %s; guest preparation:\n%s", res.Waited.Round(time.Millisecond), res.Boot.Round(time.Millisecond), res.Elapsed.Round(time.Millisecond), res.Output)
	for _, g := range tests {
		t.Run(g.name(), func(t *testing.T) {
			out, _ := os.ReadFile(filepath.Join(dir, g.name()+".out"))
			code, err := os.ReadFile(filepath.Join(dir, g.name()+".exit"))
			if err != nil {
				t.Fatalf("%s did not run in the guest: %v\n%s", g.Package, err, out)
			}
			n, err := strconv.Atoi(strings.TrimSpace(string(code)))
			if err != nil || n != 0 {
				t.Errorf("%s failed in the guest (exit %s):\n%s", g.Package, strings.TrimSpace(string(code)), out)
				return
			}
			if g.Check != nil {
				if err := g.Check(out); err != nil {
					t.Errorf("%s in the guest: %v\n%s", g.Package, err, out)
					return
				}
			}
			t.Logf("%s in the guest:\n%s", g.Package, out)
		})
	}
}

// RepoRoot returns the repository's root directory: that of the main
// module, github.com/edgeproxy/edgeproxy, whether the caller runs in it or
// in the test module (which replaces it with ../).
func RepoRoot() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", mainModule).Output()
	if err != nil {
		return "", fmt.Errorf("vm: go list -m %s: %w", mainModule, err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", fmt.Errorf("vm: module %s has no directory (not inside the repository?)", mainModule)
	}
	return dir, nil
}

const mainModule = "github.com/edgeproxy/edgeproxy"

// touchSources stats every file of the packages and of their dependencies
// inside the repository (both modules). The go test cache keys a cached result on the files a
// test consulted; without this, a change to a guest package would not
// invalidate TestGuestPackages' cached pass.
func touchSources(root string, tests []GoTest) error {
	seen := map[string]bool{}
	for _, g := range tests {
		cmd := exec.Command("go", "list", "-deps", "-test", "-f", "{{.Dir}}", ".")
		cmd.Dir = filepath.Join(root, g.Package)
		out, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("vm: go list %s: %w", g.Package, err)
		}
		for _, d := range strings.Fields(string(out)) {
			if seen[d] || !strings.HasPrefix(d, root+string(filepath.Separator)) {
				continue
			}
			seen[d] = true
			entries, err := os.ReadDir(d)
			if err != nil {
				return fmt.Errorf("vm: %w", err)
			}
			for _, e := range entries {
				if !e.IsDir() {
					_, _ = os.Stat(filepath.Join(d, e.Name()))
				}
			}
		}
	}
	return nil
}
