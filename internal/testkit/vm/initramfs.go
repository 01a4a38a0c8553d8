package vm

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// bootModules are the modules the initramfs loads itself, before the host's
// root is reachable: virtio PCI transport and 9p over virtio. Their
// dependencies are found in modules.dep; anything built in is skipped.
var bootModules = []string{"virtio_pci", "9pnet_virtio", "9p"}

// initScript is the initramfs's /init, run by busybox. It loads the 9p
// modules, mounts the host's root read-only and the shared directory
// writable at the same path the host uses, puts tmpfs where programs
// write, and switch_roots (not chroot: the kernel's module autoload runs
// /sbin/modprobe from the real root) into the stage-2 script that the host
// left in the shared directory.
const initScript = `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# The accelerator probe (accel.go) only asks whether the kernel gets here.
if [ -n "$epprobe" ]; then echo EDGEPROXY-VM-PROBE-OK; echo o > /proc/sysrq-trigger; sleep 5; fi
for m in $(cat /modules/order); do
	insmod /modules/$m || echo "edgeproxy-vm: insmod $m failed"
done
fail() { echo "edgeproxy-vm: $*"; echo b > /proc/sysrq-trigger; sleep 5; }
[ -n "$epshare" ] || fail "no epshare= on the kernel command line"
mkdir -p /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /newroot || fail "mount hostroot"
# Host paths the guest must keep seeing under the tmpfs mounts below (a
# checkout under /tmp): bind them aside first, move them back after.
keep=$(echo "$epkeep" | tr ',' ' ')
for p in $keep; do
	mkdir -p /keep$p && mount --bind /newroot$p /keep$p || fail "keep $p"
done
for d in /tmp /run /var; do
	mount -t tmpfs -o mode=1777 tmpfs /newroot$d || fail "tmpfs $d"
done
for p in $keep; do
	mkdir -p /newroot$p && mount --move /keep$p /newroot$p || fail "keep $p"
done
mkdir -p /newroot/var/tmp /newroot/var/lib /newroot/var/log /newroot/run/lock
ln -s /run /newroot/var/run
ln -s /run/lock /newroot/var/lock
mkdir -p /newroot$epshare
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 share /newroot$epshare || fail "mount share"
mount --move /dev /newroot/dev
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mkdir -p /newroot/dev/shm && mount -t tmpfs -o mode=1777 tmpfs /newroot/dev/shm
exec switch_root /newroot /bin/sh $epshare/.vm/stage2.sh
`

// kernelRelease turns /boot/vmlinuz-6.1.0-56-amd64 into 6.1.0-56-amd64.
func kernelRelease(kernel string) (string, error) {
	base := filepath.Base(kernel)
	rel, ok := strings.CutPrefix(base, "vmlinuz-")
	if !ok || rel == "" {
		return "", fmt.Errorf("vm: kernel %s: name is not vmlinuz-<release>", kernel)
	}
	return rel, nil
}

// moduleOrder returns the module files (paths relative to moddir) to insmod
// for wanted, dependencies first, each once. Modules built into the kernel
// are left out.
func moduleOrder(moddir string, wanted []string) ([]string, error) {
	deps, err := readModulesDep(filepath.Join(moddir, "modules.dep"))
	if err != nil {
		return nil, err
	}
	builtin, _ := os.ReadFile(filepath.Join(moddir, "modules.builtin"))
	byName := make(map[string]string, len(deps))
	for path := range deps {
		byName[moduleName(path)] = path
	}
	var order []string
	done := map[string]bool{}
	var visit func(path string, depth int) error
	visit = func(path string, depth int) error {
		if done[path] {
			return nil
		}
		if depth > 32 {
			return fmt.Errorf("vm: module dependencies of %s nest too deep", path)
		}
		done[path] = true
		// modules.dep lists a module's dependencies so that the last one
		// is loaded first.
		ds := deps[path]
		for i := len(ds) - 1; i >= 0; i-- {
			if err := visit(ds[i], depth+1); err != nil {
				return err
			}
		}
		order = append(order, path)
		return nil
	}
	for _, name := range wanted {
		path, ok := byName[name]
		if !ok {
			if strings.Contains(string(builtin), "/"+name+".ko\n") {
				continue
			}
			return nil, fmt.Errorf("vm: module %s is neither in %s/modules.dep nor built in", name, moddir)
		}
		if err := visit(path, 0); err != nil {
			return nil, err
		}
	}
	return order, nil
}

func moduleName(path string) string {
	base := filepath.Base(path)
	if i := strings.Index(base, ".ko"); i >= 0 {
		base = base[:i]
	}
	return strings.ReplaceAll(base, "-", "_")
}

func readModulesDep(path string) (map[string][]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("vm: read module dependencies: %w", err)
	}
	defer f.Close()
	deps := map[string][]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		mod, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		deps[mod] = strings.Fields(rest)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("vm: read %s: %w", path, err)
	}
	return deps, nil
}

// buildInitramfs writes the initramfs for kernel release rel into cacheDir
// (once: the name carries a hash of everything that goes in) and returns
// its path. Compressed modules are not supported: Debian's kernel ships
// them uncompressed (CONFIG_MODULE_COMPRESS_NONE), and an .ko.xz is
// reported as an error rather than silently skipped.
func buildInitramfs(cacheDir, rel, busybox string) (string, error) {
	moddir := filepath.Join("/lib/modules", rel)
	order, err := moduleOrder(moddir, bootModules)
	if err != nil {
		return "", err
	}
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return "", fmt.Errorf("vm: read busybox: %w", err)
	}
	h := sha256.New()
	h.Write([]byte(initScript))
	h.Write(bb)
	mods := make(map[string][]byte, len(order))
	for _, m := range order {
		if !strings.HasSuffix(m, ".ko") {
			return "", fmt.Errorf("vm: module %s is compressed; the initramfs needs plain .ko files", m)
		}
		data, err := os.ReadFile(filepath.Join(moddir, m))
		if err != nil {
			return "", fmt.Errorf("vm: read module: %w", err)
		}
		mods[m] = data
		h.Write([]byte(m))
		h.Write(data)
	}
	sum := hex.EncodeToString(h.Sum(nil))[:16]
	out := filepath.Join(cacheDir, "initramfs-"+rel+"-"+sum+".cpio")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", fmt.Errorf("vm: initramfs cache: %w", err)
	}
	tmp, err := os.CreateTemp(cacheDir, "initramfs-*.tmp")
	if err != nil {
		return "", fmt.Errorf("vm: initramfs cache: %w", err)
	}
	defer os.Remove(tmp.Name())
	c := newCPIOWriter(tmp)
	for _, d := range []string{"bin", "dev", "proc", "sys", "newroot", "modules"} {
		c.Dir(d, 0o755)
	}
	c.CharDev("dev/console", 0o600, 5, 1)
	c.CharDev("dev/null", 0o666, 1, 3)
	c.File("bin/busybox", 0o755, bb)
	c.File("init", 0o755, []byte(initScript))
	names := make([]string, 0, len(order))
	for _, m := range order {
		names = append(names, filepath.Base(m))
	}
	for _, m := range order {
		c.File("modules/"+filepath.Base(m), 0o644, mods[m])
	}
	c.File("modules/order", 0o644, []byte(strings.Join(names, "\n")+"\n"))
	if err := c.Close(); err != nil {
		tmp.Close()
		return "", fmt.Errorf("vm: write initramfs: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("vm: write initramfs: %w", err)
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return "", fmt.Errorf("vm: initramfs cache: %w", err)
	}
	return out, nil
}

// newestKernel returns the /boot/vmlinuz-* whose modules are installed,
// newest release last in version order.
func newestKernel() (string, error) {
	ks, _ := filepath.Glob("/boot/vmlinuz-*")
	var ok []string
	for _, k := range ks {
		rel, err := kernelRelease(k)
		if err != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join("/lib/modules", rel, "modules.dep")); err == nil {
			ok = append(ok, k)
		}
	}
	if len(ok) == 0 {
		return "", fmt.Errorf("vm: no /boot/vmlinuz-* with modules in /lib/modules (install linux-image-amd64)")
	}
	sort.Strings(ok)
	return ok[len(ok)-1], nil
}
