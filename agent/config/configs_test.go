package config

import (
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"
)

// The files in configs/ are loaded here so they never rot.

const (
	exampleFile = "../../configs/edgeproxy.yaml"
	demoFile    = "../../configs/demo.yaml"
)

func TestExampleConfigIsTheDefault(t *testing.T) {
	c := mustLoad(t, LoadOptions{File: exampleFile, Hostname: fixedHost("example-host")})
	want := Default()
	want.NodeName = "example-host" // the file leaves nodeName empty: the hostname
	if d := Diff(c, &want); len(d) > 0 {
		t.Fatalf("configs/edgeproxy.yaml differs from Default() at %v: update the file or Default()", d)
	}
}

func TestExampleConfigHasEveryKey(t *testing.T) {
	k := koanf.New(".")
	if err := k.Load(file.Provider(exampleFile), yaml.Parser()); err != nil {
		t.Fatal(err)
	}
	for _, key := range append(Keys(), "policy.modules", "policy.chains") {
		if !k.Exists(key) {
			t.Errorf("configs/edgeproxy.yaml does not show %s", key)
		}
	}
}

// TestExampleConfigRestartMarks checks that exactly the RestartOnly keys
// carry "[restart]" in the comment above them.
func TestExampleConfigRestartMarks(t *testing.T) {
	b, err := os.ReadFile(exampleFile)
	if err != nil {
		t.Fatal(err)
	}
	keyLine := regexp.MustCompile(`^(\s*)([A-Za-z0-9]+):`)
	marked := map[string]bool{}
	var stack []string // key path by indentation (two spaces a level)
	comment := ""
	for line := range strings.SplitSeq(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") {
			comment += trimmed + "\n"
			continue
		}
		m := keyLine.FindStringSubmatch(line)
		if m == nil {
			comment = ""
			continue
		}
		depth := len(m[1]) / 2
		stack = append(stack[:min(depth, len(stack))], m[2])
		if strings.Contains(comment, "[restart]") {
			marked[strings.Join(stack, ".")] = true
		}
		comment = ""
	}
	for _, key := range RestartOnly {
		if !marked[key] {
			t.Errorf("%s is restart-only but not marked [restart] in configs/edgeproxy.yaml", key)
		}
		delete(marked, key)
	}
	for key := range marked {
		t.Errorf("%s is marked [restart] in configs/edgeproxy.yaml but applies on reload", key)
	}
}

// TestExampleConfigPolicyExample uncomments the example policy and loads it.
func TestExampleConfigPolicyExample(t *testing.T) {
	b, err := os.ReadFile(exampleFile)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	in := false
	for line := range strings.SplitSeq(string(b), "\n") {
		switch t := strings.TrimSpace(line); {
		case strings.HasPrefix(t, "# --- example"):
			in = true
			continue
		case strings.HasPrefix(t, "# --- end of example"):
			in = false
			continue
		case t == "modules: []" || t == "chains: []":
			continue
		case in:
			line = strings.Replace(line, "# ", "", 1)
			if strings.TrimSpace(line) == "#" {
				continue
			}
		}
		out = append(out, line)
	}
	p := writeFile(t, t.TempDir(), "policy.yaml", strings.Join(out, "\n"))
	c := mustLoad(t, LoadOptions{File: p})
	pol := c.Policy
	if len(pol.Modules) != 3 || pol.Modules[2].ShadowOf != pol.Modules[0].Name || pol.Modules[2].Config["default"] != 50 ||
		len(pol.Chains) != 1 || len(pol.Chains[0].Modules) != 2 ||
		pol.Chains[0].Modules[0].Module != pol.Modules[0].Name || pol.Chains[0].Modules[1].Module != pol.Modules[1].Name ||
		pol.Chains[0].Match.Namespaces[0] != "shop" || pol.Chains[0].Modules[0].Config["default"] != 100 ||
		pol.Chains[0].Modules[1].Config["minEndpoints"] != 2 {
		t.Fatalf("example policy not loaded as shown: %+v", pol)
	}
}

func TestDemoConfig(t *testing.T) {
	c := mustLoad(t, LoadOptions{File: demoFile})
	if c.Mode != "plan" || c.Manifests != "configs/demo" || c.Kubeconfig != "" {
		t.Errorf("demo: mode %q manifests %q kubeconfig %q", c.Mode, c.Manifests, c.Kubeconfig)
	}
	if rel, err := filepath.Rel("/tmp/edgeproxy-demo", c.StateDir); err != nil || strings.HasPrefix(rel, "..") {
		t.Errorf("demo stateDir %q is not under /tmp/edgeproxy-demo", c.StateDir)
	}
	for _, a := range []string{c.Server.Healthz, c.Server.Metrics} {
		ap, err := netip.ParseAddrPort(a)
		if err != nil || !ap.Addr().IsLoopback() {
			t.Errorf("demo server address %q is not on loopback", a)
		}
	}
}

// BenchmarkLoadExample measures one reload's work: read, parse, decode and
// validate configs/edgeproxy.yaml with an env layer and flags.
func BenchmarkLoadExample(b *testing.B) {
	opts := LoadOptions{
		File:     exampleFile,
		Env:      []string{"EDGEPROXY_SYNC_MINPERIOD=2s", "PATH=/usr/bin"},
		Flags:    map[string]string{"mode": "plan"},
		Hostname: fixedHost("h"),
	}
	for b.Loop() {
		if _, err := Load(opts); err != nil {
			b.Fatal(err)
		}
	}
}
