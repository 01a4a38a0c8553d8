package agent

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// unmapExecutable drops this process's mappings of the resident pages of
// the executable's read-only segments (text, rodata, pclntab) with
// MADV_DONTNEED. They are clean file pages: they leave the process's RSS
// and stay in the page cache, as reclaimable as any cached file; code that
// runs again maps them back with a minor fault, without reading the disk.
// Before that it asks the kernel to map them back one page per fault
// (pageByPage); noFaultAround says why not, nil when it does. It returns
// the bytes of the mappings advised.
//
// Why: a Go binary's start-up touches most of its executable and keeps it
// all mapped, although a quiet agent runs a few MiB of it; MADV_DONTNEED
// and not MADV_PAGEOUT, which would read each page needed again from the
// disk (RATIONALE.md, "Why the executable's pages are dropped, not paged
// out").
func unmapExecutable() (advised int64, noFaultAround, err error) {
	ranges, err := readOnlyRanges()
	if err != nil {
		return 0, nil, fmt.Errorf("unmap the executable: %w", err)
	}
	noFaultAround = pageByPage(ranges)
	for _, r := range ranges {
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, r.start, r.end-r.start, unix.MADV_DONTNEED); errno != 0 {
			return advised, noFaultAround, fmt.Errorf("unmap the executable: madvise %#x-%#x: %w", r.start, r.end, errno)
		}
		advised += int64(r.end - r.start)
	}
	return advised, noFaultAround, nil
}

// addrRange is the addresses [start, end).
type addrRange struct{ start, end uintptr }

// readOnlyRanges lists the mappings of the executable without write
// permission.
func readOnlyRanges() ([]addrRange, error) {
	var self syscall.Stat_t
	if err := syscall.Stat("/proc/self/exe", &self); err != nil {
		return nil, err
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []addrRange
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if start, end, ok := readOnlyMapping(sc.Text(), self.Ino); ok {
			out = append(out, addrRange{start, end})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("/proc/self/maps: %w", err)
	}
	return out, nil
}

// readOnlyMapping parses one /proc/self/maps line ("start-end perms offset
// dev inode path") and says whether it maps file inode ino without write
// permission.
func readOnlyMapping(line string, ino uint64) (start, end uintptr, ok bool) {
	f := strings.Fields(line)
	if len(f) < 6 || strings.ContainsRune(f[1], 'w') {
		return 0, 0, false
	}
	if n, err := strconv.ParseUint(f[4], 10, 64); err != nil || n != ino {
		return 0, 0, false
	}
	lo, hi, found := strings.Cut(f[0], "-")
	s, err1 := strconv.ParseUint(lo, 16, 64)
	e, err2 := strconv.ParseUint(hi, 16, 64)
	if !found || err1 != nil || err2 != nil || e <= s {
		return 0, 0, false
	}
	return uintptr(s), uintptr(e), true
}

// majorFaults is how many page faults of the process had to read from the
// disk so far (getrusage's ru_majflt); 0 when it cannot be read. Code the
// page cache has lost (under memory pressure) faults in this way.
func majorFaults() int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Majflt
}
