//go:build linux && (amd64 || arm64 || riscv64 || loong64 || 386 || arm)

package agent

import (
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The part of linux/userfaultfd.h that pageByPage uses. The ioctl numbers
// are _IOWR(0xAA, nr, size) in the generic encoding of the architectures
// this file builds for.
const (
	uffdAPI            = 0xAA
	uffdUserModeOnly   = 1       // UFFD_USER_MODE_ONLY (5.11): no CAP_SYS_PTRACE needed
	uffdFeatureWPAsync = 1 << 15 // UFFD_FEATURE_WP_ASYNC (6.7)
	uffdModeWP         = 1 << 1  // UFFDIO_REGISTER_MODE_WP
	uffdioAPI          = 3<<30 | 24<<16 | 0xAA<<8 | 0x3F
	uffdioRegister     = 3<<30 | 32<<16 | 0xAA<<8 | 0x00
)

// faultAroundOff is the userfaultfd pageByPage registers the executable's
// ranges with. It stays open for the life of the process: closing it would
// unregister them.
var faultAroundOff struct {
	once sync.Once
	fd   int
	err  error
}

// pageByPage makes a minor fault in ranges map one page, not the whole
// 64 KiB around it (16 pages) that the kernel's fault-around maps when the
// page cache holds them, as it holds an executable's. Once the executable's
// mappings are dropped (unmapExecutable), fault-around would bring 16
// pages back for every page of code a quiet agent runs; page by page, the
// RSS is what it runs (RATIONALE.md, "Why the executable's pages come back
// one at a time").
//
// The kernel turns fault-around off for a range registered with a
// userfaultfd in write-protect mode. The mode asked for is the
// asynchronous one (Linux 6.7), in which the kernel resolves a write to a
// protected page itself, so no fault ever waits for this process to answer
// (the executable's pages are not written anyway, and none is
// write-protected). On an older kernel, or where seccomp refuses
// userfaultfd, it returns why and nothing changes: pages come back 64 KiB
// at a time.
func pageByPage(ranges []addrRange) error {
	u := &faultAroundOff
	u.once.Do(func() {
		fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK|uffdUserModeOnly, 0, 0)
		if errno != 0 {
			u.err = fmt.Errorf("userfaultfd: %w", errno)
			return
		}
		api := struct{ api, features, ioctls uint64 }{api: uffdAPI, features: uffdFeatureWPAsync}
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, uffdioAPI, uintptr(unsafe.Pointer(&api))); errno != 0 {
			unix.Close(int(fd))
			u.err = fmt.Errorf("userfaultfd: asynchronous write-protect (Linux 6.7): %w", errno)
			return
		}
		u.fd = int(fd)
	})
	if u.err != nil {
		return u.err
	}
	for _, r := range ranges {
		reg := struct{ start, len, mode, ioctls uint64 }{start: uint64(r.start), len: uint64(r.end - r.start), mode: uffdModeWP}
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(u.fd), uffdioRegister, uintptr(unsafe.Pointer(&reg))); errno != 0 {
			return fmt.Errorf("userfaultfd: register %#x-%#x: %w", r.start, r.end, errno)
		}
	}
	return nil
}
