package main

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb" // registers the deb packager
	"github.com/goreleaser/nfpm/v2/files"
	_ "github.com/goreleaser/nfpm/v2/rpm" // registers the rpm packager
)

const (
	name       = "edgeproxy"
	homepage   = "https://github.com/edgeproxy/edgeproxy"
	maintainer = "edgeproxy maintainers <edgeproxy@users.noreply.github.com>"
	// No license has been chosen for the project yet; the packages say so
	// rather than invent one.
	license = "NOASSERTION"
	summary = "Kubernetes Service proxy for edge nodes (kube-proxy replacement)"
	longDoc = `edgeproxy replaces kube-proxy on the nodes of edge Kubernetes clusters.
It watches Services, EndpointSlices and its Node (or reads manifests),
selects endpoints with kube-proxy's semantics, lets WebAssembly policy
modules weigh them, and programs iptables or IPVS. It keeps serving from
an on-disk snapshot when the API server is out of reach.`
)

type options struct {
	src, version, arch, binary, cli, modules, out string
	formats                                       []string
	date                                          time.Time
}

// Package paths: install.sh's variables, set for a distribution package.
var installArgs = []string{
	"PREFIX=/usr",
	"UNITDIR=/usr/lib/systemd/system",
	"MODULESLOADDIR=/usr/lib/modules-load.d",
	"TMPFILESDIR=/usr/lib/tmpfiles.d",
}

// scripts are the maintainer scripts per format, relative to
// deploy/package/scripts.
var scripts = map[string]nfpm.Scripts{
	"deb": {PostInstall: "deb/postinst", PreRemove: "deb/prerm", PostRemove: "deb/postrm"},
	"rpm": {PostInstall: "rpm/post", PreRemove: "rpm/preun", PostRemove: "rpm/postun"},
}

// depends per format. iptables mode runs iptables(-restore/-save); IPVS
// mode programs IPVS, ipsets and conntrack over netlink. (The Debian
// maintainer scripts use deb-systemd-invoke from init-system-helpers, which
// is essential: no dependency.)
var depends = map[string][]string{
	"deb": {"iptables"},
	"rpm": {"iptables"},
}

// extra is a generated file that install.sh does not install.
type extra struct {
	dst      string
	data     []byte
	packager string // "" for every format
}

// build writes one package per format and returns their paths.
func build(o options) ([]string, error) {
	if o.src == "" || o.version == "" || o.arch == "" || o.binary == "" {
		return nil, errors.New("-src, -version, -arch and -binary are required")
	}
	if o.arch != "amd64" && o.arch != "arm64" {
		return nil, fmt.Errorf("-arch %q: want amd64 or arm64", o.arch)
	}
	stage, err := os.MkdirTemp("", "edgeproxy-stage-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(stage)
	work, err := os.MkdirTemp("", "edgeproxy-pkg-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	if err := stageInstall(o, stage); err != nil {
		return nil, err
	}
	contents, err := stagedContents(stage)
	if err != nil {
		return nil, err
	}
	extras, err := generated(o)
	if err != nil {
		return nil, err
	}
	for i, e := range extras {
		src := filepath.Join(work, fmt.Sprintf("extra-%d", i))
		if err := os.WriteFile(src, e.data, 0o644); err != nil {
			return nil, err
		}
		contents = append(contents, &files.Content{Source: src, Destination: e.dst, Packager: e.packager,
			FileInfo: &files.ContentFileInfo{Mode: 0o644}})
	}
	debChangelog := filepath.Join(work, "changelog.yml")
	if err := os.WriteFile(debChangelog, chglogYAML(o.version, o.date), 0o644); err != nil {
		return nil, err
	}

	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return nil, err
	}
	var out []string
	for _, format := range o.formats {
		p, err := writePackage(o, format, contents, debChangelog)
		if err != nil {
			return out, err
		}
		out = append(out, p)
	}
	return out, nil
}

// stageInstall runs deploy/install.sh into stage with the package paths.
func stageInstall(o options, stage string) error {
	args := append([]string{filepath.Join(o.src, "deploy", "install.sh"), "DESTDIR=" + stage, "BINARY=" + o.binary}, installArgs...)
	if o.modules != "" {
		args = append(args, "MODULES="+o.modules)
	}
	cmd := exec.Command("sh", args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("package: deploy/install.sh: %w\n%s", err, out)
	}
	return nil
}

// stagedContents lists every regular file under stage as package contents,
// with its mode; files under /etc are conffiles that an upgrade never
// overwrites.
func stagedContents(stage string) (files.Contents, error) {
	var cs files.Contents
	err := filepath.WalkDir(stage, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("package: %s in the staged tree is not a regular file", p)
		}
		rel, _ := filepath.Rel(stage, p)
		c := &files.Content{Source: p, Destination: "/" + filepath.ToSlash(rel),
			FileInfo: &files.ContentFileInfo{Mode: fi.Mode().Perm()}}
		if strings.HasPrefix(c.Destination, "/etc/") {
			c.Type = files.TypeConfigNoReplace
		}
		cs = append(cs, c)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("package: list the staged tree: %w", err)
	}
	return cs, nil
}

// generated returns the man page, the completions, the changelog and the
// copyright file.
func generated(o options) ([]extra, error) {
	run := func(args ...string) ([]byte, error) {
		out, err := exec.Command(o.cli, args...).Output()
		if err != nil {
			return nil, fmt.Errorf("package: %s %s (the -cli binary must run on this machine): %w", o.cli, strings.Join(args, " "), err)
		}
		return out, nil
	}
	help, err := run("help")
	if err != nil {
		return nil, err
	}
	man, err := gzipped([]byte(manPage(string(help), o.version, o.date)))
	if err != nil {
		return nil, err
	}
	es := []extra{{dst: "/usr/share/man/man1/edgeproxy.1.gz", data: man}}
	for _, c := range []struct{ shell, dst, packager string }{
		{"bash", "/usr/share/bash-completion/completions/edgeproxy", ""},
		{"zsh", "/usr/share/zsh/vendor-completions/_edgeproxy", "deb"},
		{"zsh", "/usr/share/zsh/site-functions/_edgeproxy", "rpm"},
		{"fish", "/usr/share/fish/vendor_completions.d/edgeproxy.fish", ""},
	} {
		script, err := run("completion", c.shell)
		if err != nil {
			return nil, err
		}
		es = append(es, extra{dst: c.dst, data: script, packager: c.packager})
	}
	changes, err := os.ReadFile(filepath.Join(o.src, "CHANGELOG.md"))
	if err != nil {
		return nil, fmt.Errorf("package: %w", err)
	}
	if changes, err = gzipped(changes); err != nil {
		return nil, err
	}
	overrides, err := os.ReadFile(filepath.Join(o.src, "deploy", "package", "lintian", "overrides"))
	if err != nil {
		return nil, fmt.Errorf("package: %w", err)
	}
	es = append(es,
		extra{dst: "/usr/share/doc/edgeproxy/changelog.gz", data: changes},
		extra{dst: "/usr/share/doc/edgeproxy/copyright", data: []byte(copyright)},
		extra{dst: "/usr/share/lintian/overrides/edgeproxy", data: overrides, packager: "deb"})
	return es, nil
}

const copyright = `Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: edgeproxy
Source: ` + homepage + `

Files: *
Copyright: 2026 the edgeproxy authors
License: NOASSERTION
 No license has been chosen for edgeproxy yet. Until one is, no rights
 beyond those the law grants are given.
`

// gzipped compresses b the way Debian wants documentation compressed: best
// compression, no name or time in the header (reproducible).
func gzipped(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	w, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(b); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// chglogYAML is the Debian changelog (changelog.Debian.gz) in nfpm's chglog
// format: one entry for this build, pointing at the project's changelog.
func chglogYAML(version string, date time.Time) []byte {
	return fmt.Appendf(nil, `- semver: %q
  date: %s
  packager: %q
  deb:
    urgency: medium
    distributions: [stable]
  changes:
    - note: "See changelog.gz for what changed in this version."
`, version, date.Format(time.RFC3339), maintainer)
}

func writePackage(o options, format string, contents files.Contents, debChangelog string) (string, error) {
	pkgr, err := nfpm.Get(format)
	if err != nil {
		return "", fmt.Errorf("package: %w", err)
	}
	sc := scripts[format]
	for _, p := range []*string{&sc.PreInstall, &sc.PostInstall, &sc.PreRemove, &sc.PostRemove} {
		if *p != "" {
			*p = filepath.Join(o.src, "deploy", "package", "scripts", *p)
		}
	}
	info := &nfpm.Info{
		Name:          name,
		Arch:          o.arch,
		Platform:      "linux",
		Version:       o.version,
		VersionSchema: "none", // the version is used as given
		Section:       "net",
		Priority:      "optional",
		Maintainer:    maintainer,
		Description:   summary + "\n" + longDoc,
		Vendor:        "edgeproxy",
		Homepage:      homepage,
		License:       license,
		MTime:         o.date,
		Overridables: nfpm.Overridables{
			Depends:  depends[format],
			Contents: slices.Clone(contents),
			Scripts:  sc,
			RPM:      nfpm.RPM{Summary: summary, Group: "System Environment/Daemons", Compression: "gzip"},
			Deb:      nfpm.Deb{Compression: "gzip"},
		},
	}
	if format == "deb" {
		info.Changelog = debChangelog
	}
	info = nfpm.WithDefaults(info)
	if err := nfpm.PrepareForPackager(info, format); err != nil {
		return "", fmt.Errorf("package: %s: %w", format, err)
	}
	target := filepath.Join(o.out, pkgr.ConventionalFileName(info))
	f, err := os.Create(target)
	if err != nil {
		return "", err
	}
	if err := pkgr.Package(info, f); err != nil {
		f.Close()
		os.Remove(target)
		return "", fmt.Errorf("package: %s: %w", path.Base(target), err)
	}
	return target, f.Close()
}
