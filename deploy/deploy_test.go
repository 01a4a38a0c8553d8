package deploy_test

import (
	"bufio"
	"bytes"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
)

// unitFile is the unit in the source tree.
const unitFile = "edgeproxy.service"

// installTree runs install.sh into a fresh DESTDIR with a stub binary and
// returns the DESTDIR. extra are further NAME=VALUE arguments.
func installTree(t *testing.T, extra ...string) string {
	t.Helper()
	gate.Binaries(t, "sh", "install")
	dest := t.TempDir()
	out, err := runInstall(t, dest, extra...)
	if err != nil {
		t.Fatalf("install.sh: %v\n%s", err, out)
	}
	return dest
}

func runInstall(t *testing.T, dest string, extra ...string) ([]byte, error) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "edgeproxy")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"install.sh", "DESTDIR=" + dest, "BINARY=" + bin}, extra...)
	cmd := exec.Command("sh", args...)
	// Settings come from the arguments only, not from the test's environment.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	return cmd.CombinedOutput()
}

// tree lists the regular files under root with their modes.
func tree(t *testing.T, root string) map[string]fs.FileMode {
	t.Helper()
	files := map[string]fs.FileMode{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		files[rel] = fi.Mode()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestInstallTree(t *testing.T) {
	mods := t.TempDir()
	for _, f := range []string{"topology.wasm", "weighted.wasm", "notes.txt"} {
		if err := os.WriteFile(filepath.Join(mods, f), []byte("\x00asm"+f), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	dest := installTree(t, "MODULES="+mods)

	want := map[string]fs.FileMode{
		"usr/local/bin/edgeproxy":                       0o755,
		"etc/systemd/system/edgeproxy.service":          0o644,
		"etc/modules-load.d/edgeproxy-ipvs.conf":        0o644,
		"etc/tmpfiles.d/edgeproxy.conf":                 0o644,
		"etc/edgeproxy/config.yaml":                     0o644,
		"usr/local/share/edgeproxy/rbac.yaml":           0o644,
		"usr/local/share/edgeproxy/kubeconfig.template": 0o644,
		"usr/local/lib/edgeproxy/modules/topology.wasm": 0o644,
		"usr/local/lib/edgeproxy/modules/weighted.wasm": 0o644,
	}
	got := tree(t, dest)
	for p, m := range want {
		if gm, ok := got[p]; !ok {
			t.Errorf("missing %s", p)
		} else if gm != m {
			t.Errorf("%s has mode %v, want %v", p, gm, m)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("unexpected file %s", p)
		}
	}

	// Copies are verbatim; the unit is too when the paths are the defaults.
	for dst, src := range map[string]string{
		"etc/systemd/system/edgeproxy.service":   unitFile,
		"etc/modules-load.d/edgeproxy-ipvs.conf": "modules-load.d/edgeproxy-ipvs.conf",
		"etc/tmpfiles.d/edgeproxy.conf":          "tmpfiles.d/edgeproxy.conf",
		"etc/edgeproxy/config.yaml":              "../configs/edgeproxy.yaml",
		"usr/local/share/edgeproxy/rbac.yaml":    "rbac.yaml",
	} {
		if !bytes.Equal(read(t, filepath.Join(dest, dst)), read(t, src)) {
			t.Errorf("%s differs from %s", dst, src)
		}
	}

	// A re-install (an upgrade) keeps the node's config.
	cfg := filepath.Join(dest, "etc/edgeproxy/config.yaml")
	if err := os.WriteFile(cfg, []byte("mode: ipvs\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := runInstall(t, dest); err != nil {
		t.Fatalf("second install.sh: %v\n%s", err, out)
	}
	if got := string(read(t, cfg)); got != "mode: ipvs\n" {
		t.Errorf("re-install overwrote config.yaml: %q", got)
	}
	if !bytes.Equal(read(t, cfg+".example"), read(t, "../configs/edgeproxy.yaml")) {
		t.Error("re-install did not put the new example next to the kept config")
	}
}

func TestInstallPaths(t *testing.T) {
	dest := installTree(t, "PREFIX=/opt/edge", "SYSCONFDIR=/srv/etc", "UNITDIR=/usr/lib/systemd/system")
	for _, p := range []string{
		"opt/edge/bin/edgeproxy",
		"srv/etc/edgeproxy/config.yaml",
		"usr/lib/systemd/system/edgeproxy.service",
		"opt/edge/share/edgeproxy/rbac.yaml",
	} {
		if _, err := os.Stat(filepath.Join(dest, p)); err != nil {
			t.Errorf("%s not installed: %v", p, err)
		}
	}
	u := parseUnit(t, filepath.Join(dest, "usr/lib/systemd/system/edgeproxy.service"))
	if got, want := u.one(t, "Service", "ExecStart"), "/opt/edge/bin/edgeproxy run --config /srv/etc/edgeproxy/config.yaml"; got != want {
		t.Errorf("ExecStart = %q, want %q", got, want)
	}
	// No modules directory given: none is created.
	if _, err := os.Stat(filepath.Join(dest, "opt/edge/lib")); err == nil {
		t.Error("module directory created although MODULES was not given")
	}
}

func TestInstallErrors(t *testing.T) {
	gate.Binaries(t, "sh", "install")
	dest := t.TempDir()
	cmd := exec.Command("sh", "install.sh", "DESTDIR="+dest, "BINARY="+filepath.Join(dest, "nope"))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "no executable binary") {
		t.Errorf("install.sh with a missing binary: err=%v, output %q", err, out)
	}
	out, err = runInstall(t, dest, "FOO=bar")
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "unknown argument 'FOO=bar'") {
		t.Errorf("install.sh FOO=bar: err=%v, output %q; want exit 2 naming the argument", err, out)
	}
	out, err = runInstall(t, dest, "BINDIR=relative/bin")
	if err == nil || !strings.Contains(string(out), "must be absolute") {
		t.Errorf("install.sh with a relative BINDIR: err=%v, output %q", err, out)
	}
	if got := tree(t, dest); len(got) != 0 {
		t.Errorf("failed installs left files: %v", got)
	}
}

// hostUnitDir finds the host's systemd unit directory, which verify needs in
// its root for the targets the unit is ordered against.
func hostUnitDir(t *testing.T) string {
	for _, d := range []string{"/usr/lib/systemd/system", "/lib/systemd/system"} {
		if _, err := os.Stat(filepath.Join(d, "sysinit.target")); err == nil {
			return d
		}
	}
	gate.Skip(t, "needs systemd's unit files (sysinit.target) in /usr/lib/systemd/system (Debian package systemd)")
	return ""
}

// TestUnitVerify runs `systemd-analyze verify` on the installed unit inside
// a root where the ExecStart binary exists, so that verify checks the unit
// and not this machine's /usr/local/bin.
func TestUnitVerify(t *testing.T) {
	gate.Binaries(t, "systemd-analyze", "cp")
	units := hostUnitDir(t)
	root := installTree(t)
	lib := filepath.Join(root, "usr/lib/systemd/system")
	if err := os.MkdirAll(lib, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", units+"/.", lib).CombinedOutput(); err != nil {
		t.Fatalf("copy %s: %v\n%s", units, err, out)
	}
	verify := func() ([]byte, error) {
		cmd := exec.Command("systemd-analyze", "verify", "--root="+root, "edgeproxy.service")
		cmd.Env = append(os.Environ(), "SYSTEMD_LOG_COLOR=0", "SYSTEMD_PAGER=")
		return cmd.CombinedOutput()
	}
	out, err := verify()
	if err != nil || len(bytes.TrimSpace(out)) != 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	t.Log("systemd-analyze verify --root=DESTDIR edgeproxy.service: no findings")

	// The check is real: without the binary, verify fails.
	if err := os.Remove(filepath.Join(root, "usr/local/bin/edgeproxy")); err != nil {
		t.Fatal(err)
	}
	out, err = verify()
	if err == nil || !strings.Contains(string(out), "/usr/local/bin/edgeproxy") {
		t.Fatalf("verify without the binary: err=%v, output %q; want a failure naming it", err, out)
	}
}

var exposureRE = regexp.MustCompile(`Overall exposure level for edgeproxy\.service: ([0-9]+\.[0-9])`)

// TestUnitSecurity asks systemd how exposed the unit is: the bar is
// 3.0 or lower.
func TestUnitSecurity(t *testing.T) {
	gate.Binaries(t, "systemd-analyze")
	cmd := exec.Command("systemd-analyze", "security", "--offline=yes", "--threshold=30", unitFile)
	cmd.Env = append(os.Environ(), "SYSTEMD_LOG_COLOR=0", "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0")
	out, err := cmd.CombinedOutput()
	m := exposureRE.FindSubmatch(out)
	if m == nil {
		t.Fatalf("no exposure level in the output (err %v):\n%s", err, out)
	}
	level, perr := strconv.ParseFloat(string(m[1]), 64)
	if perr != nil {
		t.Fatal(perr)
	}
	t.Logf("systemd-analyze security --offline=yes: exposure %.1f", level)
	if level > 3.0 {
		t.Errorf("exposure %.1f is above 3.0:\n%s", level, out)
	}
	if err != nil {
		t.Errorf("systemd-analyze security --threshold=30 failed: %v\n%s", err, out)
	}
}

// unit is a parsed unit file: section → key → values in order.
type unit map[string]map[string][]string

func parseUnit(t *testing.T, path string) unit {
	t.Helper()
	u := unit{}
	sec := ""
	sc := bufio.NewScanner(bytes.NewReader(read(t, path)))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			sec = line[1 : len(line)-1]
			u[sec] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || sec == "" {
				t.Fatalf("%s: bad line %q", path, line)
			}
			u[sec][k] = append(u[sec][k], v)
		}
	}
	return u
}

func (u unit) one(t *testing.T, sec, key string) string {
	t.Helper()
	vs := u[sec][key]
	if len(vs) != 1 {
		t.Fatalf("[%s] %s set %d times, want once", sec, key, len(vs))
	}
	return vs[0]
}

// TestUnitHardening pins the settings the issue asks for, so an edit that
// drops one fails here and not on a node.
func TestUnitHardening(t *testing.T) {
	u := parseUnit(t, unitFile)
	for key, want := range map[string]string{
		"Type":                    "notify",
		"ExecStart":               "/usr/local/bin/edgeproxy run --config /etc/edgeproxy/config.yaml",
		"Restart":                 "always",
		"CapabilityBoundingSet":   "CAP_NET_ADMIN CAP_NET_RAW",
		"AmbientCapabilities":     "CAP_NET_ADMIN CAP_NET_RAW",
		"NoNewPrivileges":         "yes",
		"ProtectSystem":           "strict",
		"StateDirectory":          "edgeproxy",
		"RuntimeDirectory":        "edgeproxy",
		"ProtectHome":             "yes",
		"PrivateTmp":              "yes",
		"PrivateDevices":          "yes",
		"RestrictAddressFamilies": "AF_UNIX AF_NETLINK AF_INET AF_INET6",
		"RestrictNamespaces":      "yes",
		"LockPersonality":         "yes",
		"MemoryDenyWriteExecute":  "yes",
		"SystemCallErrorNumber":   "EPERM",
	} {
		if got := u.one(t, "Service", key); got != want {
			t.Errorf("%s=%s, want %s", key, got, want)
		}
	}
	for key, want := range map[string]string{
		"ReadWritePaths":   "/run/xtables.lock",
		"SystemCallFilter": "@system-service",
	} {
		if !slices.Contains(u["Service"][key], want) {
			t.Errorf("%s does not include %s (have %q)", key, want, u["Service"][key])
		}
	}
	for _, key := range []string{"MemoryMax", "TasksMax", "WatchdogSec"} {
		if u.one(t, "Service", key) == "" {
			t.Errorf("%s is empty", key)
		}
	}

	// The watchdog must outlast a sync period: the notifier pings only while
	// the last sync attempt is younger than WatchdogSec, and the sync loop
	// runs at least once per sync.period even when nothing changes.
	wd, err := time.ParseDuration(u.one(t, "Service", "WatchdogSec"))
	if err != nil {
		t.Fatalf("WatchdogSec: %v", err)
	}
	if period := config.Default().Sync.Period; wd < 2*period {
		t.Errorf("WatchdogSec=%v is less than twice the default sync.period %v", wd, period)
	}
}

// TestUnitEngineAgrees loads the installed config with the unit's
// environment through the agent's own config loader: with
// MemoryDenyWriteExecute=yes the Wasm engine must come out as the
// interpreter, since the compiler engine needs writable executable memory.
func TestUnitEngineAgrees(t *testing.T) {
	dest := installTree(t)
	u := parseUnit(t, filepath.Join(dest, "etc/systemd/system/edgeproxy.service"))
	var env []string
	for _, v := range u["Service"]["Environment"] {
		env = append(env, strings.Fields(v)...)
	}
	cfg, err := config.Load(config.LoadOptions{
		File:     filepath.Join(dest, "etc/edgeproxy/config.yaml"),
		Env:      env,
		Hostname: func() (string, error) { return "edge-1", nil },
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatalf("the installed config does not load with the unit's environment %q: %v", env, err)
	}
	mdwe := u.one(t, "Service", "MemoryDenyWriteExecute") == "yes"
	if mdwe && cfg.Policy.Engine != "interpreter" {
		t.Errorf("MemoryDenyWriteExecute=yes but the agent would run policy engine %q (environment %q)", cfg.Policy.Engine, env)
	}
	if config.Default().Policy.Engine != "interpreter" && !slices.Contains(env, "EDGEPROXY_POLICY_ENGINE=interpreter") {
		t.Error("the unit relies on the default engine being the interpreter, which it is not")
	}
}

// TestTmpfiles lets systemd-tmpfiles create the xtables lock in a scratch
// root.
func TestTmpfiles(t *testing.T) {
	gate.Binaries(t, "systemd-tmpfiles")
	root := installTree(t)
	conf := filepath.Join(root, "etc/tmpfiles.d/edgeproxy.conf")
	if out, err := exec.Command("systemd-tmpfiles", "--root="+root, "--create", conf).CombinedOutput(); err != nil {
		t.Fatalf("systemd-tmpfiles: %v\n%s", err, out)
	}
	fi, err := os.Stat(filepath.Join(root, "run/xtables.lock"))
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Errorf("run/xtables.lock: mode %v, want a regular file 0600", fi.Mode())
	}
}

// TestModulesLoad checks every module the modules-load.d file names against
// the installed kernels' module indexes.
func TestModulesLoad(t *testing.T) {
	gate.Binaries(t, "modinfo")
	kernels, _ := filepath.Glob("/lib/modules/*/modules.dep")
	if len(kernels) == 0 {
		gate.Skip(t, "needs a kernel's modules under /lib/modules (Debian package linux-image-amd64)")
	}
	var names []string
	for line := range strings.Lines(string(read(t, "modules-load.d/edgeproxy-ipvs.conf"))) {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") && !strings.HasPrefix(line, ";") {
			names = append(names, line)
		}
	}
	for _, want := range []string{"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh", "ip_vs_lc", "ip_vs_wlc", "ip_vs_mh", "nf_conntrack", "dummy"} {
		if !slices.Contains(names, want) {
			t.Errorf("modules-load.d file lacks %s", want)
		}
	}
	for _, dep := range kernels {
		kver := filepath.Base(filepath.Dir(dep))
		for _, n := range names {
			if out, err := exec.Command("modinfo", "-k", kver, "-F", "name", n).CombinedOutput(); err != nil {
				t.Errorf("kernel %s has no module %s: %v %s", kver, n, err, out)
			}
		}
	}
}
