package debroot

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Source must find the repository's top directory from where this package
// sits (BuildDeb builds the agent and the packager there).
func TestSourceIsTheRepositoryRoot(t *testing.T) {
	src := Source(t)
	b, err := os.ReadFile(filepath.Join(src, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if first, _, _ := strings.Cut(string(b), "\n"); first != "module github.com/edgeproxy/edgeproxy" {
		t.Errorf("%s/go.mod starts %q, want the main module", src, first)
	}
	if _, err := os.Stat(filepath.Join(src, "deploy", "package", "go.mod")); err != nil {
		t.Errorf("no packager under %s: %v", src, err)
	}
}
