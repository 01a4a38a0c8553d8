package ipvs

import (
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// kernelRelease returns the running kernel's release (uname -r), or ""
// when it cannot be read.
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// kernelAtLeast reports whether release (e.g. "6.1.0-56-amd64") is at
// least major.minor. An unreadable release counts as new enough.
func kernelAtLeast(release string, major, minor int) bool {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return true
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(strings.TrimRightFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	if err1 != nil || err2 != nil {
		return true
	}
	return ma > major || ma == major && mi >= minor
}

// connReuseWorkaround reports whether net.ipv4.vs.conn_reuse_mode must be
// set to 0 on a kernel of this release, as kube-proxy does: from 4.1 (where
// the sysctl appeared) to before 5.9, conn_reuse_mode=1 stalls a new
// connection that reuses the source port of an IPVS connection still in
// the table by about a second, and mode 0 avoids that at the cost of such
// connections not being moved off a removed real server. Linux 5.9
// (commit 35dfb013149f) fixed the stall, so from there the kernel's
// default is left alone (kubernetes#93297).
func connReuseWorkaround(release string) bool {
	return kernelAtLeast(release, 4, 1) && !kernelAtLeast(release, 5, 9)
}
