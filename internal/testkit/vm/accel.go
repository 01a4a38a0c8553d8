package vm

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// AccelEnv forces qemu's accelerator: "kvm" (no probe; a guest that cannot
// boot under it then fails) or "tcg". Empty means: KVM when it works here.
const AccelEnv = "EDGEPROXY_VM_ACCEL"

// accel is how qemu runs the guest's CPU.
type accel struct {
	// name is "kvm" or "tcg".
	name string
	// why says how it was chosen (and, for tcg, why not kvm).
	why string
}

// args are qemu's accelerator, CPU model and vCPU count (cpus, or the
// accelerator's default when 0).
//
// KVM: the host's CPU model, without arch-capabilities (MSR 0x10a): a
// nested hypervisor may refuse that MSR, and qemu then aborts before the
// guest starts ("failed to set MSR 0x10a"); the guest runs with
// mitigations=off and does not need it. Two vCPUs: the guest's work (a
// cluster, two proxies) runs side by side.
//
// TCG: one vCPU by default. A TCG vCPU keeps a host core busy; two would
// take both cores of the development machine from the host's tests.
func (a accel) args(cpus int) []string {
	if a.name == "kvm" {
		return []string{"-accel", "kvm", "-cpu", "host,-arch-capabilities", "-smp", strconv.Itoa(cmp.Or(cpus, 2))}
	}
	return []string{"-accel", "tcg", "-smp", strconv.Itoa(cmp.Or(cpus, 1))}
}

func (a accel) String() string { return a.name + " (" + a.why + ")" }

// probeTimeout bounds the probe boot. Under TCG the probe's kernel
// reaches the initramfs after ~10 s of guest time, 32 s of wall time
// beside another TCG guest (2026-11-26); a KVM that needs as long is no
// gain.
const probeTimeout = 30 * time.Second

// probeMarker is what the initramfs prints, and then powers off, when the
// kernel command line says epprobe=1.
const probeMarker = "EDGEPROXY-VM-PROBE-OK"

// chooseAccel picks the accelerator for booting p: KVM when /dev/kvm opens
// and a probe boot under it reaches the initramfs, TCG otherwise, with the
// reason. The probe's verdict is kept in cacheDir, keyed by the host's
// kernel, qemu, the guest's kernel and initramfs, so that it is paid once
// per machine: delete cacheDir/accel-* to probe again.
//
// Opening /dev/kvm is not enough: on a host whose KVM is a nested
// paravirtual one (kvm_pvm, seen on the development machine of
// 2026-11-26) qemu starts and SeaBIOS prints, but Debian's kernel never
// prints a line, for minutes.
func chooseAccel(ctx context.Context, p parts, cacheDir string) (accel, error) {
	switch v := os.Getenv(AccelEnv); v {
	case "tcg":
		return accel{"tcg", AccelEnv + "=tcg"}, nil
	case "kvm":
		return accel{"kvm", AccelEnv + "=kvm"}, nil
	case "":
	default:
		return accel{}, fmt.Errorf("vm: %s=%q: want kvm, tcg or empty", AccelEnv, v)
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return accel{"tcg", fmt.Sprintf("no KVM: %v", err)}, nil
	}
	f.Close()
	key, err := accelKey(p)
	if err != nil {
		return accel{}, err
	}
	verdictPath := filepath.Join(cacheDir, "accel-"+key)
	if b, err := os.ReadFile(verdictPath); err == nil {
		return parseVerdict(string(b), verdictPath), nil
	}
	a := probeKVM(ctx, p)
	if ctx.Err() != nil {
		// Cut short by the caller: no verdict to keep.
		return a, nil
	}
	if err := os.WriteFile(verdictPath, []byte(a.name+" "+a.why+"\n"), 0o644); err != nil {
		return accel{}, fmt.Errorf("vm: keep the KVM probe's verdict: %w", err)
	}
	return a, nil
}

// parseVerdict reads a verdict file: the accelerator's name, a space and
// why. Anything else means TCG, saying so.
func parseVerdict(s, path string) accel {
	name, why, _ := strings.Cut(strings.TrimSpace(s), " ")
	if name != "kvm" && name != "tcg" {
		return accel{"tcg", fmt.Sprintf("unreadable verdict in %s", path)}
	}
	return accel{name, why + " (kept in " + path + ")"}
}

// accelKey names what a probe's verdict depends on: the host's kernel,
// qemu's binary, the guest's kernel and initramfs.
func accelKey(p parts) (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", fmt.Errorf("vm: uname: %w", err)
	}
	h := sha256.New()
	h.Write(u.Release[:])
	h.Write(u.Version[:])
	for _, f := range []string{p.qemu, p.kernel, p.initrd} {
		st, err := os.Stat(f)
		if err != nil {
			return "", fmt.Errorf("vm: %w", err)
		}
		fmt.Fprintf(h, "%s %d %d\n", f, st.Size(), st.ModTime().UnixNano())
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// probeKVM boots p under KVM with a small memory and no devices but the
// serial console, and says KVM when the initramfs printed probeMarker
// within probeTimeout. qemu is killed by its PID when the time is up.
func probeKVM(ctx context.Context, p parts) accel {
	kvm := accel{name: "kvm"}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	args := append(kvm.args(1), "-m", "256", "-nographic", "-no-reboot", "-nodefaults", "-serial", "stdio",
		"-kernel", p.kernel, "-initrd", p.initrd,
		"-append", "console=ttyS0 panic=-1 loglevel=1 mitigations=off edd=off no_timer_check epprobe=1")
	cmd := exec.CommandContext(ctx, p.qemu, args...)
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start).Round(time.Millisecond)
	if bytes.Contains(out.Bytes(), []byte(probeMarker)) {
		return accel{"kvm", fmt.Sprintf("a probe boot reached the initramfs in %s", took)}
	}
	why := fmt.Sprintf("qemu exited: %v", err)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		why = fmt.Sprintf("the kernel did not reach the initramfs in %s", probeTimeout)
	}
	last := strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(string(tail(out.Bytes(), 300)), "?"))
	last = strings.Join(strings.Fields(last), " ")
	return accel{"tcg", fmt.Sprintf("KVM probe failed: %s; console ends %q", why, last)}
}
