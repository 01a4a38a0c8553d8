package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/goreleaser/nfpm/v2/files"
)

const help = `edgeproxy — a kube-proxy replacement for edge nodes

Usage:
  edgeproxy [run] [flags]            run the proxy
.dot at the start, a back\slash and a 'quote'
`

func TestManPage(t *testing.T) {
	page := manPage(help, "0.1.0", time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC))
	for _, want := range []string{
		".TH EDGEPROXY 1 \"2026-11-22\" \"edgeproxy 0.1.0\" \"User Commands\"\n",
		".SH NAME\nedgeproxy \\- a kube\\-proxy replacement for edge nodes\n",
		".SH SYNOPSIS\n.nf\nUsage:\n  edgeproxy [run] [flags]            run the proxy\n",
		"\\&.dot at the start, a back\\eslash and a \\(aqquote\\(aq\n.fi\n",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("man page lacks %q:\n%s", want, page)
		}
	}
	// man finds nothing to warn about (as lintian runs it).
	if _, err := exec.LookPath("man"); err != nil {
		t.Log("no man on PATH; the roff is not checked by man")
		return
	}
	p := filepath.Join(t.TempDir(), "edgeproxy.1")
	if err := os.WriteFile(p, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("man", "--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z", p)
	cmd.Env = append(os.Environ(), "MANROFFSEQ=", "MANWIDTH=80")
	var stderr strings.Builder
	cmd.Stderr = &stderr // the formatted page goes to stdout, warnings to stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("man --warnings: %v\n%s", err, stderr.String())
	}
	if warn := strings.TrimSpace(stderr.String()); warn != "" {
		t.Errorf("man --warnings:\n%s", warn)
	}
}

func TestStagedContents(t *testing.T) {
	stage := t.TempDir()
	for p, mode := range map[string]os.FileMode{
		"usr/bin/edgeproxy":                        0o755,
		"etc/edgeproxy/config.yaml":                0o644,
		"usr/lib/systemd/system/edgeproxy.service": 0o644,
	} {
		if err := os.MkdirAll(filepath.Join(stage, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(stage, p), []byte(p), mode); err != nil {
			t.Fatal(err)
		}
	}
	cs, err := stagedContents(stage)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*files.Content{}
	for _, c := range cs {
		got[c.Destination] = c
	}
	if len(got) != 3 {
		t.Fatalf("contents %v", got)
	}
	if c := got["/etc/edgeproxy/config.yaml"]; c.Type != files.TypeConfigNoReplace {
		t.Errorf("config.yaml has type %q, want a conffile (%q)", c.Type, files.TypeConfigNoReplace)
	}
	if c := got["/usr/bin/edgeproxy"]; c.Type != "" || c.FileInfo.Mode != 0o755 {
		t.Errorf("binary: type %q mode %v", c.Type, c.FileInfo.Mode)
	}

	if err := os.Symlink("edgeproxy", filepath.Join(stage, "usr/bin/link")); err != nil {
		t.Fatal(err)
	}
	if _, err := stagedContents(stage); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a symlink in the staged tree: %v", err)
	}
}

func TestBuildRefusesBadOptions(t *testing.T) {
	for _, o := range []options{
		{},
		{src: ".", version: "1", arch: "mips", binary: "x"},
	} {
		if _, err := build(o); err == nil {
			t.Errorf("build(%+v) succeeded", o)
		}
	}
}

func TestChangelogYAML(t *testing.T) {
	y := string(chglogYAML("0.1.0~dev.1.gabc", time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)))
	for _, want := range []string{`semver: "0.1.0~dev.1.gabc"`, "date: 2026-11-22T00:00:00Z", `packager: "` + maintainer + `"`} {
		if !strings.Contains(y, want) {
			t.Errorf("changelog lacks %q:\n%s", want, y)
		}
	}
}
