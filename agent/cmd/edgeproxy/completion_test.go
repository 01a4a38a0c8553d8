package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
)

// TestCompletionTableMatchesParsers hands every flag of the completion
// table to the command's real parser without a value: a flag the parser
// knows fails with "needs an argument", an unknown one with "not defined".
// No command gets as far as doing anything.
func TestCompletionTableMatchesParsers(t *testing.T) {
	for _, c := range commands {
		for _, f := range c.flags {
			args := []string{c.name}
			if c.name == "module" {
				args = append(args, "check")
			}
			args = append(args, "-"+f.name)
			var stdout, stderr bytes.Buffer
			code := run(args, &stdout, &stderr)
			if code != 2 || !strings.Contains(stderr.String(), "flag needs an argument: -"+f.name) {
				t.Errorf("edgeproxy %s: exit %d, %q; want the parser to know -%s and ask for its value",
					strings.Join(args, " "), code, firstLine(stderr.String()), f.name)
			}
		}
	}
}

// TestCompletionCoversUsage: every command and flag the usage text names
// completes.
func TestCompletionCoversUsage(t *testing.T) {
	var names, flags []string
	for _, c := range commands {
		names = append(names, c.name)
		for _, f := range c.flags {
			flags = append(flags, f.dashed())
		}
	}
	for _, m := range regexp.MustCompile(`(?m)^  edgeproxy \[?([a-z]+)`).FindAllStringSubmatch(usage, -1) {
		if !slices.Contains(names, m[1]) {
			t.Errorf("usage names command %q, the completion table does not", m[1])
		}
	}
	for _, f := range regexp.MustCompile(`(?:^|[\s\[|])(--?[a-z][a-z-]*)`).FindAllStringSubmatch(usage, -1) {
		if f[1] != "-h" && f[1] != "--help" && !slices.Contains(flags, f[1]) {
			t.Errorf("usage names flag %s, the completion table does not", f[1])
		}
	}
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

func script(t *testing.T, shell string) string {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run([]string{"completion", shell}, &out, &errb); code != 0 {
		t.Fatalf("completion %s: exit %d: %s", shell, code, errb.String())
	}
	p := filepath.Join(t.TempDir(), "edgeproxy."+shell)
	if err := os.WriteFile(p, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// completionDir holds files for the file-completion cases.
func completionDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"topology.wasm", "notes.txt"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "mods"), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestBashCompletion runs the bash script the way bash's programmable
// completion does: COMP_WORDS split as readline splits them ("=" is a word
// of its own), then the function, then COMPREPLY.
func TestBashCompletion(t *testing.T) {
	gate.Binaries(t, "bash")
	file := script(t, "bash")
	dir := completionDir(t)
	for _, tc := range []struct {
		words []string // the last one is being completed
		want  []string
	}{
		{[]string{"pl"}, []string{"plan"}},
		{[]string{""}, []string{"run", "plan", "status", "explain", "cleanup", "module", "version", "completion", "help"}},
		{[]string{"plan", "--mo"}, []string{"--mode"}},
		{[]string{"plan", "--mode", ""}, []string{"iptables", "ipvs", "nftables", "plan"}},
		{[]string{"run", "--mode", "ip"}, []string{"iptables", "ipvs"}},
		{[]string{"--mode", "=", ""}, []string{"iptables", "ipvs", "nftables", "plan"}},
		{[]string{"--mode", "=", "ipvs", "--node-name", "n1", "st"}, []string{"status"}},
		{[]string{"status", "-o", ""}, []string{"text", "json"}},
		{[]string{"status", "-"}, []string{"-o", "--server", "--config"}},
		{[]string{"completion", ""}, []string{"bash", "zsh", "fish"}},
		{[]string{"module", ""}, []string{"check"}},
		{[]string{"module", "check", ""}, []string{"mods", "topology.wasm"}},
		{[]string{"module", "--config", "x", "check", "-o", "json", ""}, []string{"mods", "topology.wasm"}},
		{[]string{"run", "--manifests", ""}, []string{"mods"}},
		{[]string{"explain", ""}, nil},
	} {
		words := append([]string{"edgeproxy"}, tc.words...)
		var quoted []string
		for _, w := range words {
			quoted = append(quoted, "'"+w+"'")
		}
		prog := `source "$1"; COMP_WORDS=(` + strings.Join(quoted, " ") + `); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _edgeproxy; printf '%s\n' "${COMPREPLY[@]}"`
		cmd := exec.Command("bash", "--norc", "--noprofile", "-c", prog, "bash", file)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("%q: %v\n%s", words, err, out)
			continue
		}
		got := strings.Fields(string(out))
		slices.Sort(got)
		want := slices.Clone(tc.want)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("completing %q: got %q, want %q", words, got, want)
		}
	}
}

// TestFishCompletion asks fish itself what it would complete.
func TestFishCompletion(t *testing.T) {
	gate.Binaries(t, "fish")
	file := script(t, "fish")
	dir := completionDir(t)
	for line, want := range map[string][]string{
		"edgeproxy pl":               {"plan"},
		"edgeproxy plan --mode ":     {"iptables", "ipvs", "nftables", "plan"},
		"edgeproxy status -o ":       {"json", "text"},
		"edgeproxy completion ":      {"bash", "fish", "zsh"},
		"edgeproxy module ":          {"check"},
		"edgeproxy module check ":    {"mods/", "topology.wasm"},
		"edgeproxy version --":       nil,
		"edgeproxy run --manifests ": {"mods/"},
	} {
		cmd := exec.Command("fish", "--no-config", "-c", "source $argv[1]; complete -C $argv[2]", file, line)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("%q: %v\n%s", line, err, out)
			continue
		}
		var got []string
		for l := range strings.Lines(string(out)) {
			if w, _, _ := strings.Cut(strings.TrimSpace(l), "\t"); w != "" {
				got = append(got, w)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("completing %q: got %q, want %q", line, got, want)
		}
	}
}

// TestZshCompletion checks the script parses and registers itself with
// compinit when sourced.
func TestZshCompletion(t *testing.T) {
	gate.Binaries(t, "zsh")
	file := script(t, "zsh")
	if out, err := exec.Command("zsh", "-n", file).CombinedOutput(); err != nil {
		t.Fatalf("zsh -n: %v\n%s", err, out)
	}
	cmd := exec.Command("zsh", "-f", "-c", `autoload -U compinit && compinit -u -D && source "$1" && print -r -- $_comps[edgeproxy]`, "zsh", file)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "_edgeproxy" {
		t.Fatalf("sourced in zsh: %v, completion function for edgeproxy %q, want _edgeproxy", err, out)
	}
}

func TestCompletionUnknownShell(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"completion", "tcsh"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), `unknown shell "tcsh"`) {
		t.Errorf("completion tcsh: exit %d, %q", code, errb.String())
	}
}
