package deploy_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/internal/testkit/debroot"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
)

// TestPackageLifecycle installs the amd64 .deb from `make package` into a
// throwaway root with the real dpkg, upgrades it to a second build of
// another version, downgrades it while stopped, removes and purges it, and
// runs systemd-analyze verify on the installed unit. See package debroot
// for what in the root is real: dpkg and the maintainer scripts under a real
// shell are; systemctl is a state-keeping stand-in.
func TestPackageLifecycle(t *testing.T) {
	gate.Binaries(t, "chroot", "dpkg-query")
	r := debroot.New(t)
	u := debroot.NewUpgrade(t)
	oldDeb, oldV, newDeb, newV := u.Old, u.OldVersion, u.New, u.NewVersion

	// Install: files in place, nothing enabled or started, and it says so.
	out := r.MustDpkg(t, "-i", oldDeb)
	t.Logf("dpkg -i %s:\n%s", filepath.Base(oldDeb), out)
	if got := r.Status("edgeproxy"); got != "installed "+oldV {
		t.Fatalf("status after install: %q", got)
	}
	if !strings.Contains(out, "not enabled or started: the node needs its") {
		t.Error("install does not say that nothing was started")
	}
	s := r.Service()
	if s.Active || s.Enabled {
		t.Errorf("install enabled or started the service: %+v", s)
	}
	if !strings.Contains(s.Log, "systemd-tmpfiles --create edgeproxy.conf") {
		t.Errorf("install did not create the xtables lock: %q", s.Log)
	}
	for _, p := range packageFiles {
		if _, err := os.Stat(r.Path(p)); err != nil {
			t.Errorf("not installed: %v", err)
		}
	}

	t.Run("systemd-analyze verify", func(t *testing.T) { verifyInstalledUnit(t, r) })

	// The admin configures the node and starts the service; the agent has
	// written its state.
	cfg := r.Path("etc/edgeproxy/config.yaml")
	edited := append(read(t, cfg), "\n# this node\nkubeconfig: /etc/edgeproxy/kubeconfig\n"...)
	writeFile(t, cfg, edited)
	writeFile(t, r.Path("etc/edgeproxy/kubeconfig"), []byte("apiVersion: v1\n"))
	if err := os.MkdirAll(r.Path("var/lib/edgeproxy"), 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, r.Path("var/lib/edgeproxy/snapshot.json"), []byte("{}"))
	r.Systemctl(t, "enable", "edgeproxy.service")
	r.Systemctl(t, "start", "edgeproxy.service")
	if s := r.Service(); s.Running != "edgeproxy "+oldV {
		t.Fatalf("started service runs %q", s.Running)
	}

	// Upgrade: the running service is restarted onto the new binary; the
	// edited config is kept without a prompt.
	out = r.MustDpkg(t, "-i", newDeb)
	t.Logf("dpkg -i %s:\n%s", filepath.Base(newDeb), out)
	if got := r.Status("edgeproxy"); got != "installed "+newV {
		t.Fatalf("status after upgrade: %q", got)
	}
	if s := r.Service(); !s.Active || s.Running != "edgeproxy "+newV {
		t.Errorf("after the upgrade the service runs %q (active %v), want edgeproxy %s", s.Running, s.Active, newV)
	}
	if !bytes.Equal(read(t, cfg), edited) {
		t.Error("the upgrade overwrote the edited /etc/edgeproxy/config.yaml")
	}
	if m, _ := filepath.Glob(r.Path("etc/edgeproxy/*.dpkg-*")); len(m) != 0 {
		t.Errorf("the upgrade left %v", m)
	}

	// A stopped service stays stopped across a version change (here back
	// to the first build).
	r.Systemctl(t, "stop", "edgeproxy.service")
	r.MustDpkg(t, "-i", oldDeb)
	if s := r.Service(); s.Active {
		t.Errorf("a version change started a stopped service: %+v", s)
	}

	// Remove: stopped, kernel rules left to `edgeproxy cleanup` (said so),
	// config and state kept.
	r.Systemctl(t, "start", "edgeproxy.service")
	out = r.MustDpkg(t, "-r", "edgeproxy")
	t.Logf("dpkg -r:\n%s", out)
	if s := r.Service(); s.Active {
		t.Error("remove left the service running")
	}
	if !strings.Contains(out, "run `edgeproxy cleanup`") {
		t.Error("remove does not say that the kernel rules stay until edgeproxy cleanup")
	}
	if got := r.Status("edgeproxy"); got != "config-files "+oldV {
		t.Errorf("status after remove: %q", got)
	}
	for _, p := range []string{"etc/edgeproxy/config.yaml", "var/lib/edgeproxy/snapshot.json"} {
		if _, err := os.Stat(r.Path(p)); err != nil {
			t.Errorf("remove deleted %s: %v", p, err)
		}
	}
	if _, err := os.Stat(r.Path("usr/bin/edgeproxy")); err == nil {
		t.Error("remove left the binary")
	}

	// Purge: the state directory and the conffile go; the admin's
	// kubeconfig stays, and it says so.
	out = r.MustDpkg(t, "-P", "edgeproxy")
	t.Logf("dpkg -P:\n%s", out)
	if got := r.Status("edgeproxy"); got != "" && !strings.HasPrefix(got, "not-installed") {
		t.Errorf("status after purge: %q", got)
	}
	for _, p := range []string{"var/lib/edgeproxy", "etc/edgeproxy/config.yaml", "etc/systemd/system/multi-user.target.wants/edgeproxy.service"} {
		if _, err := os.Lstat(r.Path(p)); err == nil {
			t.Errorf("purge left %s", p)
		}
	}
	if _, err := os.Stat(r.Path("etc/edgeproxy/kubeconfig")); err != nil {
		t.Errorf("purge deleted the admin's kubeconfig: %v", err)
	}
	if !strings.Contains(out, "purged /var/lib/edgeproxy") {
		t.Error("purge does not say what it kept")
	}
}

// verifyInstalledUnit runs systemd-analyze verify on the unit dpkg
// installed, in the root (with the host's unit files for the targets it
// orders against).
func verifyInstalledUnit(t *testing.T, r *debroot.Root) {
	gate.Binaries(t, "systemd-analyze", "cp")
	units := hostUnitDir(t)
	if out, err := exec.Command("cp", "-an", units+"/.", r.Path("usr/lib/systemd/system")).CombinedOutput(); err != nil {
		t.Fatalf("copy %s: %v\n%s", units, err, out)
	}
	cmd := exec.Command("systemd-analyze", "verify", "--root="+r.Dir, "edgeproxy.service")
	cmd.Env = append(os.Environ(), "SYSTEMD_LOG_COLOR=0", "SYSTEMD_PAGER=")
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) != 0 {
		t.Fatalf("systemd-analyze verify --root=ROOT edgeproxy.service: %v\n%s", err, out)
	}
	t.Log("systemd-analyze verify on the installed unit: no findings")
}

func writeFile(t *testing.T, p string, b []byte) {
	t.Helper()
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
