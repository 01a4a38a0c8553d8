package agent

import (
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
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

// cachedPages counts the pages of the executable's read-only mappings
// that the page cache holds (mincore: for a file mapping it answers for
// the file's page, mapped here or not).
func cachedPages(t *testing.T) int {
	t.Helper()
	var self syscall.Stat_t
	if err := syscall.Stat("/proc/self/exe", &self); err != nil {
		t.Fatal(err)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(maps), "\n") {
		start, end, ok := readOnlyMapping(l, self.Ino)
		if !ok {
			continue
		}
		vec := make([]byte, (end-start+uintptr(os.Getpagesize())-1)/uintptr(os.Getpagesize()))
		if _, _, errno := unix.Syscall(unix.SYS_MINCORE, start, end-start, uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
			t.Fatal("mincore:", errno)
		}
		for _, v := range vec {
			n += int(v & 1)
		}
	}
	return n
}

// TestUnmapExecutable: the test binary's resident file pages (most of its
// text after start-up, as in the agent) leave this process's RSS, and stay
// in the page cache, so that code run again needs no read from the disk.
func TestUnmapExecutable(t *testing.T) {
	before, cached := rssFile(t), cachedPages(t)
	n, noFaultAround, err := unmapExecutable()
	if err != nil {
		t.Fatal(err)
	}
	if noFaultAround != nil {
		t.Logf("pages come back 64 KiB at a time: %v", noFaultAround)
	}
	after, still := rssFile(t), cachedPages(t)
	t.Logf("advised %d MiB; RssFile %d → %d kB; pages in the page cache %d → %d", n>>20, before, after, cached, still)
	if n == 0 {
		t.Fatal("no read-only mapping of the executable found")
	}
	// How much stays depends on what runs at the moment (the code
	// unmapping, the test runner): in a full `go test ./...` the binary had
	// only 4 MiB resident to begin with and kept 2.5; alone, 23 MiB went to 2.
	if after >= before {
		t.Fatalf("RssFile %d kB after unmapping, %d kB before: nothing left", after, before)
	}
	// The page cache may lose a page or two meanwhile to other work.
	// MADV_PAGEOUT, run on this binary once written back, evicted 862 of
	// 8414.
	if still < cached*98/100 {
		t.Fatalf("%d of %d cached pages of the executable left the page cache", cached-still, cached)
	}
}

// TestPageByPage: once the executable's pages are dropped, reading one
// page of its text maps that page back, not the 64 KiB around it that the
// kernel's fault-around maps (16 pages, all of which the page cache holds).
// The pages read are 12 spread over the text, as data: no code runs from
// them, so whatever else is present in their windows is code the test
// process ran meanwhile (with fault-around, all 16 pages of each window).
func TestPageByPage(t *testing.T) {
	n, noFaultAround, err := unmapExecutable()
	if err != nil {
		t.Fatal(err)
	}
	if noFaultAround != nil {
		gate.Skip(t, fmt.Sprintf("the kernel maps pages back 64 KiB at a time: %v", noFaultAround))
	}
	ranges, err := readOnlyRanges()
	if err != nil || len(ranges) == 0 {
		t.Fatalf("%d ranges, %v", len(ranges), err)
	}
	text := ranges[0] // the first: r-x, the lowest addresses
	const window = 16
	page := uintptr(os.Getpagesize())
	pm, err := os.Open("/proc/self/pagemap")
	if err != nil {
		t.Fatal(err)
	}
	defer pm.Close()
	var spots []uintptr
	for i := 1; i <= 12; i++ {
		spots = append(spots, (text.start+uintptr(i)*(text.end-text.start)/14)&^(page*window-1))
	}
	// A pointer into the text, from which the spots are reached.
	base := unsafe.Pointer(reflect.ValueOf(TestPageByPage).Pointer())
	var sum byte
	for _, p := range spots {
		sum += *(*byte)(unsafe.Add(base, int(p+3*page)-int(uintptr(base)))) // a page inside the window
	}
	present := 0
	buf := make([]byte, 8*window)
	for _, p := range spots {
		if _, err := pm.ReadAt(buf, int64(p/page)*8); err != nil {
			t.Fatal(err)
		}
		for k := range window {
			if buf[k*8+7]&0x80 != 0 { // bit 63: present
				present++
			}
		}
	}
	t.Logf("advised %d MiB; %d of the %d pages of the windows read present (byte sum %d)", n>>20, present, len(spots)*window, sum)
	if present < len(spots) {
		t.Fatalf("%d pages present, fewer than the %d read", present, len(spots))
	}
	if present > len(spots)*window/2 {
		t.Fatalf("%d of the %d pages of the windows read are present: fault-around still maps them", present, len(spots)*window)
	}
}
