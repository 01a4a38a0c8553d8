// Package debroot installs edgeproxy's .deb into a throwaway root with the
// real dpkg (`dpkg --root`), and builds packages of other versions for
// upgrade tests.
//
// What is real and what is not: dpkg unpacks, tracks conffiles and runs the
// maintainer scripts, chrooted into the root as `dpkg --root` always does.
// The root's userland is a static busybox (sh, rm, ...), so the scripts run
// under a real POSIX shell. systemd cannot run in a chroot: the root has
// /run/systemd/system (so the scripts take the "systemd is running" path)
// and small state-keeping stand-ins for systemctl and deb-systemd-invoke
// whose state the tests read: is the service active, enabled, and which
// binary version did its last start run (it runs the installed
// /usr/bin/edgeproxy version). The
// restart of a real agent under traffic is shown by the netns e2e test,
// which performs the same stop and start itself.
package debroot

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
)

// Root is a throwaway dpkg root.
type Root struct {
	Dir string
}

// fakeSystemctl keeps a service's state in /run/fake-systemd: "active"
// holds the first line of `edgeproxy version` of the running binary,
// "enabled" marks an enabled unit, "log" lists the commands (for messages).
const fakeSystemctl = `#!/bin/sh
# Stand-in for systemctl in a throwaway root (internal/testkit/debroot).
s=/run/fake-systemd
mkdir -p $s
echo "systemctl $*" >>$s/log
verb=""
for a; do
	case $a in
	-*) ;;
	*) if [ -z "$verb" ]; then verb=$a; fi ;;
	esac
done
case $verb in
daemon-reload) ;;
is-active) [ -f $s/active ] ;;
is-enabled) [ -f $s/enabled ] ;;
start | restart) /usr/bin/edgeproxy version | head -n 1 >$s/active ;;
try-restart) if [ -f $s/active ]; then /usr/bin/edgeproxy version | head -n 1 >$s/active; fi ;;
stop) rm -f $s/active ;;
enable) : >$s/enabled ;;
disable) rm -f $s/enabled ;;
*) echo "fake systemctl: unsupported $verb" >&2; exit 1 ;;
esac
`

// fakeInvoke stands in for deb-systemd-invoke (a Perl program): like it,
// restart starts a unit only when it is enabled or already running.
const fakeInvoke = `#!/bin/sh
action=$1
shift
case $action in
restart) if systemctl --quiet is-enabled "$@" || systemctl --quiet is-active "$@"; then systemctl restart "$@"; fi ;;
start) if systemctl --quiet is-enabled "$@"; then systemctl start "$@"; fi ;;
*) systemctl "$action" "$@" ;;
esac
`

const fakeTmpfiles = `#!/bin/sh
echo "systemd-tmpfiles $*" >>/run/fake-systemd/log
`

// New makes a root with dpkg's database, busybox and the systemctl
// stand-in. It needs root (dpkg chroots into it).
func New(t *testing.T) *Root {
	t.Helper()
	gate.Root(t)
	gate.Binaries(t, "dpkg", "dpkg-deb")
	busybox := "/usr/bin/busybox"
	if out, err := exec.Command("file", "-L", busybox).Output(); err != nil || !bytes.Contains(out, []byte("statically linked")) {
		gate.Skip(t, "needs a static /usr/bin/busybox (Debian package busybox-static)")
	}
	r := &Root{Dir: t.TempDir()}
	for _, d := range []string{"usr/bin", "usr/sbin", "usr/lib", "etc", "tmp", "run/systemd/system", "run/fake-systemd",
		"var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers"} {
		r.mkdir(t, d)
	}
	for _, l := range [][2]string{{"bin", "usr/bin"}, {"sbin", "usr/sbin"}, {"lib", "usr/lib"}} {
		if err := os.Symlink(l[1], r.Path(l[0])); err != nil {
			t.Fatal(err)
		}
	}
	r.mkdir(t, "dev")
	if err := syscall.Mknod(r.Path("dev/null"), syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
		t.Fatalf("mknod dev/null: %v", err)
	}
	for _, f := range []string{"var/lib/dpkg/status", "var/lib/dpkg/available"} {
		r.write(t, f, "", 0o644)
	}
	b, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	r.write(t, "usr/bin/busybox", string(b), 0o755)
	list, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		t.Fatalf("busybox --list: %v", err)
	}
	for _, applet := range strings.Fields(string(list)) {
		if applet == "busybox" {
			continue
		}
		if err := os.Symlink("busybox", r.Path("usr/bin", applet)); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
	}
	r.write(t, "usr/bin/systemctl", fakeSystemctl, 0o755)
	r.write(t, "usr/bin/systemd-tmpfiles", fakeTmpfiles, 0o755)
	r.write(t, "usr/bin/deb-systemd-invoke", fakeInvoke, 0o755)
	return r
}

// Path joins parts below the root.
func (r *Root) Path(parts ...string) string {
	return filepath.Join(append([]string{r.Dir}, parts...)...)
}

func (r *Root) mkdir(t *testing.T, d string) {
	t.Helper()
	if err := os.MkdirAll(r.Path(d), 0o755); err != nil {
		t.Fatal(err)
	}
}

func (r *Root) write(t *testing.T, p, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(r.Path(p), []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

// Dpkg runs dpkg on the root. Dependencies (iptables) are not installed in
// the root, so they are not enforced there.
func (r *Root) Dpkg(args ...string) (string, error) {
	cmd := exec.Command("dpkg", append([]string{"--root=" + r.Dir, "--force-depends", "--force-confold"}, args...)...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND=noninteractive"}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// MustDpkg runs dpkg and fails t when it fails.
func (r *Root) MustDpkg(t *testing.T, args ...string) string {
	t.Helper()
	out, err := r.Dpkg(args...)
	if err != nil {
		t.Fatalf("dpkg %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// Systemctl runs the systemctl stand-in inside the root, as an admin would.
func (r *Root) Systemctl(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("chroot", append([]string{r.Dir, "/usr/bin/systemctl"}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("systemctl %s in the root: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// Service is the state of the edgeproxy service in the root.
type Service struct {
	Active  bool
	Running string // first line of `edgeproxy version` of the binary last started
	Enabled bool
	Log     string // every systemctl and systemd-tmpfiles call, one a line
}

// Service reads the stand-in's state.
func (r *Root) Service() Service {
	var s Service
	if b, err := os.ReadFile(r.Path("run/fake-systemd/active")); err == nil {
		s.Active, s.Running = true, strings.TrimSpace(string(b))
	}
	_, err := os.Stat(r.Path("run/fake-systemd/enabled"))
	s.Enabled = err == nil
	b, _ := os.ReadFile(r.Path("run/fake-systemd/log"))
	s.Log = string(b)
	return s
}

// Status is the package's status in the root's dpkg database, or "" when
// dpkg does not know it.
func (r *Root) Status(pkg string) string {
	out, err := exec.Command("dpkg-query", "--admindir="+r.Path("var/lib/dpkg"), "-W", "-f", "${db:Status-Status} ${Version}", pkg).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// Source is the repository's top directory.
func Source(t *testing.T) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}
