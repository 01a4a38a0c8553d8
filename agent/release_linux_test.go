package agent

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

func TestReadOnlyMapping(t *testing.T) {
	for _, c := range []struct {
		line       string
		start, end uintptr
		ok         bool
	}{
		{"00400000-01438000 r-xp 00000000 fe:00 9978637   /usr/bin/edgeproxy", 0x400000, 0x1438000, true},
		{"01438000-0246b000 r--p 01038000 fe:00 9978637   /usr/bin/edgeproxy", 0x1438000, 0x246b000, true},
		{"0246b000-02508000 rw-p 0206b000 fe:00 9978637   /usr/bin/edgeproxy", 0, 0, false}, // data: written
		{"00400000-01438000 r-xp 00000000 fe:00 1234      /usr/lib/other.so", 0, 0, false},  // another file
		{"7f56a3415000-7f56a3417000 r-xp 00000000 00:00 0 [vdso]", 0, 0, false},
		{"garbage", 0, 0, false},
	} {
		s, e, ok := readOnlyMapping(c.line, 9978637)
		if s != c.start || e != c.end || ok != c.ok {
			t.Errorf("readOnlyMapping(%q) = %#x, %#x, %v; want %#x, %#x, %v", c.line, s, e, ok, c.start, c.end, c.ok)
		}
	}
}

// rssFile is RssFile of this process in kB.
func rssFile(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "RssFile:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no RssFile in /proc/self/status")
	return 0
}

// TestPageOutExecutable: the test binary's resident file pages (most of its
// text after start-up, as in the agent) leave this process's RSS.
func TestPageOutExecutable(t *testing.T) {
	before := rssFile(t)
	n, err := pageOutExecutable()
	if errors.Is(err, syscall.EINVAL) {
		t.Skip("this kernel has no MADV_PAGEOUT (Linux 5.4 and later):", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	after := rssFile(t)
	t.Logf("advised %d MiB; RssFile %d → %d kB", n>>20, before, after)
	if n == 0 {
		t.Fatal("no read-only mapping of the executable found")
	}
	// How much stays depends on what runs at the moment (the code paging
	// out, the test runner): in a full `go test ./...` the binary had only
	// 4 MiB resident to begin with and kept 2.5; alone, 23 MiB went to 2.
	if after >= before {
		t.Fatalf("RssFile %d kB after paging out, %d kB before: nothing left", after, before)
	}
}
