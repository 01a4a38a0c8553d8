// Package vm boots Debian's kernel under qemu (KVM when it works on this
// machine, TCG otherwise: see chooseAccel) with the host's root shared
// read-only over 9p, runs one batch of commands inside, and hands back
// what they wrote. It exists because the host kernel of the development
// and CI machines has no IPVS and no dummy links: every test that needs
// them runs here, in one boot per batch (a boot costs seconds under TCG).
//
// The guest sees the host's files at the same paths, so a Go test binary
// built on the host runs inside unchanged. The shared directory (Options.Dir)
// is mounted writable at its host path; /tmp, /run, /var and /dev/shm are
// tmpfs. The guest's eth0 is qemu's user network: the host is 10.0.2.2.
//
// The suites that boot it (the guest packages, the agent in IPVS mode, the
// kube-proxy baseline) are in test/vm, in the test module; this runner sits
// in the main module so that the main module's guest tests can call Guest.
package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// GuestEnv is set to "1" in the environment of everything Options.Script
// runs; InGuest reports it.
const GuestEnv = "EDGEPROXY_IN_VM"

// InGuest reports whether this process runs inside the test VM.
func InGuest() bool { return os.Getenv(GuestEnv) == "1" }

// DefaultModules are loaded in the guest before the script runs. A module
// that fails to load is reported in Result.Output's preamble and does not
// stop the script (which should then fail on its own terms).
var DefaultModules = []string{
	"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_lc", "ip_vs_wlc", "ip_vs_sh", "ip_vs_mh",
	"nf_conntrack", "dummy", "veth", "bridge", "br_netfilter", "virtio_net",
	"ip_set", "ip_set_hash_ip", "ip_set_hash_ipport", "ip_set_hash_ipportip",
	"ip_set_hash_ipportnet", "ip_set_hash_net", "ip_set_bitmap_port",
}

// Options describe one VM run.
type Options struct {
	// Dir is a host directory shared writable with the guest at the same
	// path; the script runs there. Required. Run writes its own files
	// under Dir/.vm.
	Dir string
	// Script is a /bin/sh script run in the guest as root, in Dir.
	Script string
	// Env adds KEY=value pairs to the script's environment.
	Env []string
	// HostPaths are host directories the guest must see even where it
	// mounts a tmpfs (/tmp, /run, /var): e.g. a checkout under /tmp. They
	// stay read-only. Paths must not contain commas or spaces.
	HostPaths []string
	// Modules to modprobe before the script; nil means DefaultModules.
	Modules []string
	// Timeout bounds the whole run, boot included; 0 means 10 minutes.
	Timeout time.Duration
	// MemoryMB is the guest's memory; 0 means 1024.
	MemoryMB int
	// CPUs is the guest's vCPU count; 0 means the accelerator's default
	// (KVM 2, TCG 1: see accel.args).
	CPUs int
	// Kernel is the vmlinuz to boot; empty means the newest
	// /boot/vmlinuz-* whose modules are installed.
	Kernel string
	// CacheDir keeps the built initramfs; empty means
	// $XDG_CACHE_HOME/edgeproxy/vm (or ~/.cache/...).
	CacheDir string
	// Console, if set, receives the serial console as it is written.
	Console io.Writer
}

// Result is what a finished run left behind.
type Result struct {
	// ExitCode is the script's exit status.
	ExitCode int
	// Output is the script's stdout and stderr, preceded by the guest's
	// preparation messages.
	Output []byte
	// Console is the guest's serial console (kernel log and init).
	Console []byte
	// Boot is the time from starting qemu until the script started.
	Boot time.Duration
	// Elapsed is the whole run, from starting qemu until it exited.
	Elapsed time.Duration
	// Waited is how long Run waited for another VM to end (see lockVM).
	Waited time.Duration
	// Accel is qemu's accelerator and why it was chosen, e.g. "tcg (no
	// KVM: open /dev/kvm: no such file or directory)". Output's first
	// line says the same.
	Accel string
}

// ErrNotFinished is wrapped by Run's error when the guest stopped (or was
// stopped) before the script finished.
var ErrNotFinished = errors.New("vm: guest did not finish the script")

// Check reports what is missing to run a VM on this machine, or nil.
func Check() error {
	var errs []error
	for _, b := range []string{"qemu-system-x86_64", "busybox"} {
		if _, err := exec.LookPath(b); err != nil {
			errs = append(errs, fmt.Errorf("vm: %s not on PATH (install qemu-system-x86, busybox-static)", b))
		}
	}
	if _, err := newestKernel(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

const readyMarker = "EDGEPROXY-VM-READY"

// stage2 runs in the guest after switch_root, with the host's /bin/sh. It
// prepares the guest, runs the script with its output in .vm/output,
// records the exit status and reboots, which ends qemu (-no-reboot).
const stage2 = `#!/bin/sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/tmp TMPDIR=/tmp EDGEPROXY_IN_VM=1
cd "$epshare" || echo b > /proc/sysrq-trigger
out=$epshare/.vm/output
{
	echo "edgeproxy-vm: kernel $(uname -r), up $(cut -d" " -f1 /proc/uptime)s"
	if ! modprobe -a $(cat .vm/modules); then
		for m in $(cat .vm/modules); do
			modprobe "$m" || echo "edgeproxy-vm: modprobe $m failed"
		done
	fi
	ip link set lo up
	if ip link set eth0 up 2>/dev/null; then
		ip addr add 10.0.2.15/24 dev eth0
		ip route add default via 10.0.2.2
	fi
	echo "edgeproxy-vm: ready, up $(cut -d" " -f1 /proc/uptime)s"
} >"$out" 2>&1
echo ` + readyMarker + `
set -a
. ./.vm/env
set +a
/bin/sh ./.vm/script.sh >>"$out" 2>&1
echo $? >.vm/exit.tmp && mv .vm/exit.tmp .vm/exit
sync
echo b > /proc/sysrq-trigger
sleep 10
`

// Run boots the VM, runs o.Script in it and returns its result. The error
// is nil only when the script ran to its end (whatever its exit status);
// qemu is killed, by its PID, when ctx ends or the timeout passes.
func Run(ctx context.Context, o Options) (*Result, error) {
	if o.Dir == "" || !filepath.IsAbs(o.Dir) || strings.ContainsAny(o.Dir, " \t\n\"'") {
		return nil, fmt.Errorf("vm: Dir %q must be an absolute path without spaces or quotes", o.Dir)
	}
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Minute
	}
	if o.MemoryMB == 0 {
		o.MemoryMB = 1024
	}
	if o.Modules == nil {
		o.Modules = DefaultModules
	}
	p, err := findParts(o)
	if err != nil {
		return nil, err
	}
	meta, err := prepareShare(o)
	if err != nil {
		return nil, err
	}
	release, waited, err := lockVM(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	acc, err := chooseAccel(ctx, p, p.cache)
	if err != nil {
		return nil, err
	}

	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	// no_timer_check: at boot the kernel checks that the 8254 timer's
	// interrupt arrives through the IO-APIC within a few ticks; a TCG
	// vCPU starved by a loaded host misses that ("IO-APIC + timer doesn't
	// work!", a panic: TestMatrixIPVS on 2026-11-26 at load ~20). The
	// timer is qemu's; the check tells nothing about it.
	args := append(acc.args(o.CPUs), "-m", strconv.Itoa(o.MemoryMB),
		"-nographic", "-no-reboot",
		"-kernel", p.kernel, "-initrd", p.initrd,
		"-append", "console=ttyS0 panic=-1 loglevel=4 mitigations=off edd=off no_timer_check epshare="+o.Dir+keepArg(o.HostPaths),
		"-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
		"-virtfs", "local,path="+o.Dir+",mount_tag=share,security_model=none,multidevs=remap",
		"-nic", "user,model=virtio-net-pci",
	)
	cmd := exec.CommandContext(ctx, p.qemu, args...)
	// CommandContext kills the process by its PID (Process.Kill) when ctx
	// ends; WaitDelay bounds the wait for its output pipes after that.
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	con := &console{start: start, live: o.Console}
	cmd.Stdout = con
	cmd.Stderr = con
	runErr := cmd.Run()
	res := &Result{Elapsed: time.Since(start), Waited: waited, Accel: acc.String()}
	res.Console, res.Boot = con.snapshot()
	err = readResult(ctx, res, meta, o.Timeout, runErr)
	res.Output = append([]byte("edgeproxy-vm: accel "+res.Accel+"\n"), res.Output...)
	return res, err
}

// parts are the host programs and files a boot needs, and the cache
// directory that holds the initramfs and the KVM probe's verdict.
type parts struct{ kernel, initrd, qemu, cache string }

// findParts finds the kernel (o.Kernel or the newest installed), builds
// or reuses the initramfs in the cache, and finds qemu.
func findParts(o Options) (parts, error) {
	var p parts
	p.kernel = o.Kernel
	if p.kernel == "" {
		k, err := newestKernel()
		if err != nil {
			return p, err
		}
		p.kernel = k
	}
	rel, err := kernelRelease(p.kernel)
	if err != nil {
		return p, err
	}
	cache := o.CacheDir
	if cache == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			return p, fmt.Errorf("vm: cache dir: %w", err)
		}
		cache = filepath.Join(base, "edgeproxy", "vm")
	}
	p.cache = cache
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		return p, fmt.Errorf("vm: busybox: %w", err)
	}
	if p.initrd, err = buildInitramfs(cache, rel, busybox); err != nil {
		return p, err
	}
	if p.qemu, err = exec.LookPath("qemu-system-x86_64"); err != nil {
		return p, fmt.Errorf("vm: qemu: %w", err)
	}
	return p, nil
}

// prepareShare writes the guest's second stage, script, environment and
// module list into o.Dir/.vm (emptied first) and returns that directory.
func prepareShare(o Options) (string, error) {
	meta := filepath.Join(o.Dir, ".vm")
	if err := os.RemoveAll(meta); err != nil {
		return "", fmt.Errorf("vm: clear %s: %w", meta, err)
	}
	if err := os.MkdirAll(meta, 0o755); err != nil {
		return "", fmt.Errorf("vm: %w", err)
	}
	var env strings.Builder
	for _, kv := range o.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return "", fmt.Errorf("vm: env %q is not KEY=value", kv)
		}
		fmt.Fprintf(&env, "%s=%s\n", k, shellQuote(v))
	}
	files := map[string]string{
		"stage2.sh": stage2,
		"script.sh": o.Script,
		"env":       env.String(),
		"modules":   strings.Join(o.Modules, "\n") + "\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(meta, name), []byte(content), 0o755); err != nil {
			return "", fmt.Errorf("vm: %w", err)
		}
	}
	return meta, nil
}

// readResult fills res with the script's output and exit status from the
// share; without an exit status the script did not finish, and the error
// says why (timeout, qemu's own error) with the console's end.
func readResult(ctx context.Context, res *Result, meta string, timeout time.Duration, runErr error) error {
	res.Output, _ = os.ReadFile(filepath.Join(meta, "output"))
	code, readErr := os.ReadFile(filepath.Join(meta, "exit"))
	if readErr != nil {
		why := "it stopped"
		if ctx.Err() != nil {
			why = fmt.Sprintf("timed out after %s", timeout)
		} else if runErr != nil {
			why = runErr.Error()
		}
		return fmt.Errorf("%w (%s); console ends:\n%s", ErrNotFinished, why, tail(res.Console, 3000))
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(code)))
	if err != nil {
		return fmt.Errorf("vm: exit status %q: %w", code, err)
	}
	res.ExitCode = n
	return nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// console collects qemu's output and notes when the ready marker appears.
type console struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	start time.Time
	boot  time.Duration
	live  io.Writer
}

func (c *console) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf.Write(p)
	if c.boot == 0 && bytes.Contains(tail(c.buf.Bytes(), len(p)+len(readyMarker)), []byte(readyMarker)) {
		c.boot = time.Since(c.start)
	}
	if c.live != nil {
		c.live.Write(p)
	}
	return len(p), nil
}

func (c *console) snapshot() ([]byte, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.buf.Bytes()), c.boot
}

// keepArg passes HostPaths to the guest's init on the kernel command line.
func keepArg(paths []string) string {
	if len(paths) == 0 {
		return ""
	}
	return " epkeep=" + strings.Join(paths, ",")
}

// lockPath makes the VMs of one machine run one at a time. A guest under
// TCG keeps a core busy; go test runs packages side by side, and two
// guests at once on a two-core machine (the conformance package's IPVS
// matrix and test/vm's switch test, in one CI run of 2026-11-26) starved
// each other and the host's tests until probes with a deadline failed.
const lockPath = "/tmp/edgeproxy-vm.lock"

// lockVM takes lockPath, waiting while another VM holds it (or until ctx
// ends), and returns how to give it back and how long it waited.
func lockVM(ctx context.Context) (release func(), waited time.Duration, err error) {
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, 0, fmt.Errorf("vm: %w", err)
	}
	start := time.Now()
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, time.Since(start), nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, 0, fmt.Errorf("vm: lock %s: %w", lockPath, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, 0, fmt.Errorf("vm: waiting for another VM to end: %w", ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}
