package deploy_test

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/internal/testkit/debroot"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
)

// packageFiles is what every package holds (zsh's directory differs:
// Debian's vendor-completions, site-functions elsewhere).
var packageFiles = []string{
	"/etc/edgeproxy/config.yaml",
	"/usr/bin/edgeproxy",
	"/usr/lib/edgeproxy/modules/scheduler.wasm",
	"/usr/lib/edgeproxy/modules/topology-rust.wasm",
	"/usr/lib/edgeproxy/modules/topology.wasm",
	"/usr/lib/edgeproxy/modules/weighted.wasm",
	"/usr/lib/edgeproxy/modules/zoneweight.wasm",
	"/usr/lib/modules-load.d/edgeproxy-ipvs.conf",
	"/usr/lib/systemd/system/edgeproxy.service",
	"/usr/lib/tmpfiles.d/edgeproxy.conf",
	"/usr/share/bash-completion/completions/edgeproxy",
	"/usr/share/doc/edgeproxy/changelog.gz",
	"/usr/share/doc/edgeproxy/copyright",
	"/usr/share/edgeproxy/kubeconfig.template",
	"/usr/share/edgeproxy/rbac.yaml",
	"/usr/share/fish/vendor_completions.d/edgeproxy.fish",
	"/usr/share/man/man1/edgeproxy.1.gz",
}

var debOnly = []string{
	"/usr/share/doc/edgeproxy/changelog.Debian.gz",
	"/usr/share/lintian/overrides/edgeproxy",
	"/usr/share/zsh/vendor-completions/_edgeproxy",
}

func output(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr)
	}
	return string(out)
}

// TestPackages checks what `make package` built for both architectures:
// file lists, conffiles, the static binary of the right architecture, and
// the rpm read back with rpm itself.
func TestPackages(t *testing.T) {
	gate.Binaries(t, "dpkg-deb", "rpm", "file")
	for _, arch := range []struct{ deb, rpm, file string }{
		{"amd64", "x86_64", "x86-64"},
		{"arm64", "aarch64", "ARM aarch64"},
	} {
		t.Run(arch.deb, func(t *testing.T) {
			deb := debroot.Package(t, "edgeproxy_*_"+arch.deb+".deb")
			version := debroot.Field(t, deb, "Version")
			if got := debroot.Field(t, deb, "Architecture"); got != arch.deb {
				t.Errorf("Architecture: %s", got)
			}
			if filepath.Base(deb) != "edgeproxy_"+version+"_"+arch.deb+".deb" {
				t.Errorf("file name %s does not follow edgeproxy_<version>_<arch>.deb", filepath.Base(deb))
			}
			var got []string
			for l := range strings.Lines(output(t, "dpkg-deb", "-c", deb)) {
				f := strings.Fields(l)
				if p := strings.TrimPrefix(f[len(f)-1], "."); !strings.HasSuffix(p, "/") {
					got = append(got, p)
				}
			}
			want := append(slices.Clone(packageFiles), debOnly...)
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf(".deb files:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}

			ctl := t.TempDir()
			output(t, "dpkg-deb", "-e", deb, ctl)
			if c := string(read(t, filepath.Join(ctl, "conffiles"))); c != "/etc/edgeproxy/config.yaml\n" {
				t.Errorf("conffiles: %q", c)
			}
			root := t.TempDir()
			output(t, "dpkg-deb", "-x", deb, root)
			ft := output(t, "file", filepath.Join(root, "usr/bin/edgeproxy"))
			if !strings.Contains(ft, "statically linked") || !strings.Contains(ft, arch.file) {
				t.Errorf("binary: %s; want a static %s executable", ft, arch.file)
			}
			t.Logf("file: %s", strings.TrimSpace(ft[strings.Index(ft, ":")+1:]))
			u := parseUnit(t, filepath.Join(root, "usr/lib/systemd/system/edgeproxy.service"))
			if got := u.one(t, "Service", "ExecStart"); got != "/usr/bin/edgeproxy run --config /etc/edgeproxy/config.yaml" {
				t.Errorf("packaged unit ExecStart=%s", got)
			}
			if cfg := string(read(t, filepath.Join(root, "etc/edgeproxy/config.yaml"))); strings.Contains(cfg, "/usr/local") ||
				!strings.Contains(cfg, "/usr/lib/edgeproxy/modules/topology.wasm") {
				t.Error("packaged config.yaml does not point at the packaged modules")
			}

			rpmFile := debroot.Package(t, "edgeproxy-*."+arch.rpm+".rpm")
			if q := output(t, "rpm", "-qp", "--qf", "%{NAME} %{VERSION} %{ARCH}", rpmFile); q != "edgeproxy "+version+" "+arch.rpm {
				t.Errorf("rpm: %q, want edgeproxy %s %s", q, version, arch.rpm)
			}
			got = strings.Fields(output(t, "rpm", "-qpl", rpmFile))
			want = append(slices.Clone(packageFiles), "/usr/share/zsh/site-functions/_edgeproxy")
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("rpm -qpl:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			if c := output(t, "rpm", "-qpc", rpmFile); c != "/etc/edgeproxy/config.yaml\n" {
				t.Errorf("rpm config files: %q", c)
			}
			if s := output(t, "rpm", "-qp", "--scripts", rpmFile); !strings.Contains(s, "try-restart edgeproxy.service") ||
				!strings.Contains(s, "not enabled or started") {
				t.Errorf("rpm scripts lack the upgrade restart or the install message:\n%s", s)
			}
		})
	}
}

// lintianAllowed are the tags lintian may report below warning level, with
// why they stay.
var lintianAllowed = map[string]string{
	// info: the unit has no SysV script; edgeproxy needs systemd
	// (Type=notify, watchdog, sandbox).
	"package-supports-alternative-init-but-no-init.d-script": "systemd only",
	// info: strings inside the Go binary from its dependencies.
	"spelling-error-in-binary": "dependencies' strings",
	// overridden (deploy/package/lintian/overrides): static on purpose.
	"statically-linked-binary": "Go, CGO_ENABLED=0",
}

// TestLintian runs lintian on the amd64 .deb: no error, no warning, and only
// the listed info tags and overrides.
func TestLintian(t *testing.T) {
	gate.Binaries(t, "lintian")
	deb := debroot.Package(t, "edgeproxy_*_amd64.deb")
	// Exit status 2 means an error or a warning was found: listed below.
	out, err := exec.Command("lintian", "--no-cfg", "--fail-on", "error,warning", "--display-info", "--pedantic", "--show-overrides", deb).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); err != nil && (!ok || ee.ExitCode() != 2) {
		t.Fatalf("lintian: %v\n%s", err, out)
	}
	for l := range strings.Lines(string(out)) {
		l = strings.TrimSpace(l)
		kind, rest, ok := strings.Cut(l, ": ")
		if !ok || len(kind) != 1 || kind == "N" {
			continue // notes and lintian's own remarks
		}
		_, rest, _ = strings.Cut(rest, ": ")
		tag, _, _ := strings.Cut(rest, " ")
		if _, allowed := lintianAllowed[tag]; (kind == "I" || kind == "O" || kind == "P") && allowed {
			t.Logf("lintian %s", l)
			continue
		}
		t.Errorf("lintian %s", l)
	}
}
