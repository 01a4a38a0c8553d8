package debroot

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
)

// Packages is the directory `make package` wrote to, from
// EDGEPROXY_PACKAGES (make test sets it).
func Packages(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("EDGEPROXY_PACKAGES")
	if dir == "" {
		gate.Skip(t, "needs EDGEPROXY_PACKAGES, the output directory of `make package` (make test sets it)")
	}
	return dir
}

// Package finds the one file in the packages directory matching pattern
// (e.g. "edgeproxy_*_amd64.deb").
func Package(t *testing.T, pattern string) string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(Packages(t), pattern))
	if err != nil || len(m) != 1 {
		t.Fatalf("want one %s in %s, found %v (%v); run make package", pattern, Packages(t), m, err)
	}
	return m[0]
}

// Field reads a control field of a .deb.
func Field(t *testing.T, deb, field string) string {
	t.Helper()
	out, err := exec.Command("dpkg-deb", "-f", deb, field).Output()
	if err != nil {
		t.Fatalf("dpkg-deb -f %s %s: %v", deb, field, err)
	}
	return strings.TrimSpace(string(out))
}

// BuildDeb builds the amd64 agent with the given version string and packages
// it as a .deb of that version, the way `make package` does (the packager
// from EDGEPROXY_PACKAGER, else built from deploy/package). It returns the
// .deb's path.
func BuildDeb(t *testing.T, version string) string {
	t.Helper()
	gate.Binaries(t, "go")
	src := Source(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "edgeproxy")
	run(t, src, []string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64"},
		"go", "build", "-trimpath", "-ldflags", "-s -w -X main.version="+version, "-o", bin, "./agent/cmd/edgeproxy")
	packager := os.Getenv("EDGEPROXY_PACKAGER")
	if packager == "" {
		packager = filepath.Join(dir, "edgeproxy-package")
		run(t, filepath.Join(src, "deploy", "package"), nil, "go", "build", "-o", packager, ".")
	}
	args := []string{"-src", src, "-version", version, "-arch", "amd64", "-binary", bin, "-out", dir, "-formats", "deb"}
	if mods := filepath.Join(src, "bin", "modules"); dirExists(mods) {
		args = append(args, "-modules", mods)
	}
	run(t, src, nil, packager, args...)
	m, _ := filepath.Glob(filepath.Join(dir, "edgeproxy_*_amd64.deb"))
	if len(m) != 1 {
		t.Fatalf("packager wrote %v", m)
	}
	return m[0]
}

func run(t *testing.T, dir string, env []string, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

func dirExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// Upgrade is a pair of amd64 packages: Old from `make package`, New a
// second build of a higher version (Old's with "+upgrade").
type Upgrade struct {
	Old, OldVersion string
	New, NewVersion string
}

// NewUpgrade finds Old and builds New.
func NewUpgrade(t *testing.T) Upgrade {
	t.Helper()
	u := Upgrade{Old: Package(t, "edgeproxy_*_amd64.deb")}
	u.OldVersion = Field(t, u.Old, "Version")
	u.NewVersion = u.OldVersion + "+upgrade"
	u.New = BuildDeb(t, u.NewVersion)
	return u
}
