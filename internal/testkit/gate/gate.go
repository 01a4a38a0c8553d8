// Package gate holds the test tiers' entry checks. A test that needs root, a
// kernel feature or a built binary calls one of these first; each skips with
// the reason stated, and EDGEPROXY_REQUIRE_ALL=1 (set by `make test` in CI)
// turns every such skip into a failure so that no tier is silently lost.
package gate

import (
	"os"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
)

// RequireAll reports whether skips are forbidden.
func RequireAll() bool { return os.Getenv("EDGEPROXY_REQUIRE_ALL") == "1" }

// Skip skips t for reason, or fails it when skips are forbidden.
func Skip(t testing.TB, reason string) {
	t.Helper()
	if RequireAll() {
		t.Fatalf("cannot run: %s (EDGEPROXY_REQUIRE_ALL=1 forbids skipping)", reason)
	}
	t.Skip(reason)
}

// Root skips unless the test runs as root.
func Root(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Skip(t, "needs root (network namespaces and kernel rules)")
	}
}

// Binaries skips unless every named program is on PATH.
func Binaries(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			Skip(t, "needs "+n+" on PATH")
		}
	}
}

// SCTP skips unless the kernel makes SCTP sockets (module sctp; the host
// here has none, the test VM's kernel has it).
func SCTP(t testing.TB) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP)
	if err != nil {
		Skip(t, "needs SCTP in the kernel (module sctp): "+err.Error())
		return
	}
	unix.Close(fd)
}
