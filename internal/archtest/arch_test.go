// Package archtest holds the import rules of ARCHITECTURE.md ("Packages and
// what they may import") by test, as Kubernetes' import-boss does: it asks
// `go list -deps` for the import graph of the main module on each platform
// its code is built for and fails on any edge the table does not allow.
// The test module (test/) and the packager (deploy/package) are their own
// Go modules and may import everything, so they are not listed.
package archtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/edgeproxy/edgeproxy"

// rule is one row of the table: the packages it names and what they may
// import besides the standard library. Paths without a dot in their first
// element are inside this module; "p/..." is p and everything below it; "*"
// is anything.
type rule struct {
	pkgs []string
	may  []string
}

// Groups of outside packages the table names by what they are.
var (
	prometheus = "github.com/prometheus/client_golang/..."
	unix       = "golang.org/x/sys/unix"
	kernel     = []string{
		"github.com/vishvananda/netlink/...", "github.com/mdlayher/netlink/...",
		"github.com/moby/ipvs", "github.com/ti-mo/conntrack", "github.com/coreos/go-iptables/...", unix,
	}
)

// rules mirrors ARCHITECTURE.md's table row by row; change both together.
var rules = []rule{
	{pkgs: []string{"agent/cmd/edgeproxy"}, may: []string{"*"}},
	{pkgs: []string{"agent"}, may: join([]string{"agent/...", "datapath/...", "policy/...",
		"k8s.io/client-go/kubernetes", "k8s.io/client-go/rest", "k8s.io/client-go/tools/clientcmd", prometheus,
		"golang.org/x/sync/errgroup"}, kernel)},
	{pkgs: []string{"agent/source"}, may: []string{"k8s.io/...", "agent/model", "agent/config",
		"github.com/fsnotify/fsnotify", prometheus, unix}},
	{pkgs: []string{"agent/model", "agent/state", "agent/selection", "agent/planner"}, may: []string{"agent/...", "datapath"}},
	{pkgs: []string{"agent/policychain"}, may: []string{"agent/model", "agent/config", "policy", "policy/abi", prometheus}},
	{pkgs: []string{"agent/config"}, may: []string{"github.com/knadh/koanf/...", "go.yaml.in/yaml/v3", "github.com/fsnotify/fsnotify", prometheus}},
	{pkgs: []string{"agent/snapshot"}, may: []string{"agent/model", "datapath"}},
	{pkgs: []string{"agent/healthcheck"}},
	{pkgs: []string{"agent/prober"}},
	{pkgs: []string{"agent/runner"}},
	{pkgs: []string{"agent/runner/runnertest"}, may: []string{"agent/runner"}},
	{pkgs: []string{"agent/notify"}, may: []string{"github.com/coreos/go-systemd/v22/daemon"}},
	{pkgs: []string{"policy"}, may: []string{"github.com/tetratelabs/wazero/...", "policy/abi"}},
	{pkgs: []string{"policy/abi"}},
	{pkgs: []string{"modules/..."}, may: []string{"policy/abi", "modules/..."}},
	{pkgs: []string{"datapath"}},
	{pkgs: []string{"datapath/iptables", "datapath/ipvs", "datapath/ipset", "datapath/conntrack", "datapath/sysctl", "datapath/recorder"},
		may: join([]string{"datapath", "datapath/...", prometheus}, kernel)},
	{pkgs: []string{"datapath/nftables"}, may: []string{"datapath", "datapath/conntrack", "datapath/nfgen", "datapath/sysctl", "github.com/google/nftables/...", prometheus, unix}},
	{pkgs: []string{"datapath/nfgen"}, may: []string{"github.com/mdlayher/netlink/...", unix}},
	{pkgs: []string{"datapath/kubeproxy"}, may: join([]string{"datapath", "datapath/xtables", "datapath/ipvs", "datapath/ipset", "datapath/nfgen"}, kernel)},
	{pkgs: []string{"datapath/xtables"}, may: []string{"datapath"}},
	{pkgs: []string{"internal/testkit/..."}, may: []string{"internal/testkit/...",
		"github.com/vishvananda/netlink/...", "github.com/vishvananda/netns", unix}},
	{pkgs: []string{"deploy"}},
	{pkgs: []string{"internal/archtest"}},
}

// never are the rules on whole subgraphs: no package matching from has a
// dependency, direct or not, matching any of to.
var never = []struct {
	from, to []string
	why      string
}{
	{from: []string{"policy/...", "datapath/..."}, to: []string{"k8s.io/...", "agent/..."},
		why: "policy/ and datapath/ know nothing of Kubernetes or the agent (the agent translates)"},
	{from: []string{"agent/model", "agent/state", "agent/selection", "agent/planner"}, to: []string{"k8s.io/..."},
		why: "the core is Kubernetes-free"},
}

// only names packages that a single set of packages may import directly.
var only = []struct {
	pkgs, importers []string
	why             string
}{
	{pkgs: []string{"k8s.io/client-go/informers/...", "k8s.io/client-go/tools/cache"}, importers: []string{"agent/source"},
		why: "only agent/source imports client-go informers"},
	{pkgs: []string{"internal/testkit/...", "agent/runner/runnertest", "modules/modbuild"},
		importers: []string{"internal/testkit/..."},
		why:       "test helpers are imported by tests only, never by the code that ships"},
}

// platforms are the targets the module's code is built for: the agent's
// (linux), a developer's machine (the *_other.go files) and the modules'.
var platforms = []struct{ goos, goarch, pattern string }{
	{"linux", "amd64", module + "/..."},
	{"darwin", "arm64", module + "/..."},
	{"wasip1", "wasm", module + "/modules/..."},
}

type pkg struct {
	ImportPath string
	Standard   bool
	Imports    []string
}

func TestImports(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is not on PATH: the import graph comes from go list")
	}
	for _, p := range platforms {
		t.Run(p.goos+"/"+p.goarch, func(t *testing.T) {
			pkgs := list(t, p.goos, p.goarch, p.pattern)
			for _, v := range check(pkgs) {
				t.Error(v)
			}
			if p.goos == "linux" {
				for _, v := range stale(pkgs) {
					t.Error(v)
				}
			}
		})
	}
}

// list returns the packages of pattern and all their dependencies.
func list(t *testing.T, goos, goarch, pattern string) map[string]*pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-e", "-deps", "-json=ImportPath,Standard,Imports", pattern)
	cmd.Env = append(cmd.Environ(), "GOOS="+goos, "GOARCH="+goarch, "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s (GOOS=%s GOARCH=%s): %v\n%s", pattern, goos, goarch, err, stderr.Bytes())
	}
	pkgs := map[string]*pkg{}
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("go list: decode: %v", err)
		}
		pkgs[p.ImportPath] = &p
	}
	if len(pkgs) == 0 {
		t.Fatalf("go list %s listed no package", pattern)
	}
	return pkgs
}

// check returns one message per forbidden edge in the graph.
func check(pkgs map[string]*pkg) []string {
	var bad []string
	for _, path := range sortedKeys(pkgs) {
		p := pkgs[path]
		rel, ok := local(path)
		if !ok {
			continue
		}
		var rows []rule
		for _, r := range rules {
			if matchAny(r.pkgs, rel) {
				rows = append(rows, r)
			}
		}
		if len(rows) != 1 {
			bad = append(bad, fmt.Sprintf("%s is in %d rows of the import table, want 1 (ARCHITECTURE.md and rules)", rel, len(rows)))
			continue
		}
		for _, imp := range p.Imports {
			if dep := pkgs[imp]; dep != nil && dep.Standard {
				continue
			}
			if !matchAny(rows[0].may, name(imp)) {
				bad = append(bad, fmt.Sprintf("%s imports %s: its row allows only the standard library and %v", rel, name(imp), rows[0].may))
			}
		}
		for _, n := range never {
			if !matchAny(n.from, rel) {
				continue
			}
			for _, path := range reach(pkgs, path, n.to) {
				bad = append(bad, fmt.Sprintf("%s depends on %s (%s): %s", rel, path[len(path)-1], strings.Join(path, " → "), n.why))
			}
		}
		for _, o := range only {
			if matchAny(o.importers, rel) {
				continue
			}
			for _, imp := range p.Imports {
				if matchAny(o.pkgs, name(imp)) {
					bad = append(bad, fmt.Sprintf("%s imports %s: %s", rel, name(imp), o.why))
				}
			}
		}
	}
	return bad
}

// stale returns one message per package the table names that does not
// exist, so that a rename updates the table too.
func stale(pkgs map[string]*pkg) []string {
	var bad []string
	for _, r := range rules {
		for _, p := range r.pkgs {
			base, _ := strings.CutSuffix(p, "/...")
			if _, ok := pkgs[module+"/"+base]; !ok && !strings.HasSuffix(p, "/...") {
				bad = append(bad, fmt.Sprintf("the import table names %s, which is no package (ARCHITECTURE.md and rules)", p))
			}
		}
	}
	return bad
}

// reach returns a shortest import path from a package to each package
// matching to that it reaches without passing through another one.
func reach(pkgs map[string]*pkg, from string, to []string) [][]string {
	prev := map[string]string{from: ""}
	var found [][]string
	for queue := []string{from}; len(queue) > 0; queue = queue[1:] {
		cur := queue[0]
		if cur != from && matchAny(to, name(cur)) {
			var path []string
			for p := cur; p != ""; p = prev[p] {
				path = append(path, name(p))
			}
			slices.Reverse(path)
			found = append(found, path)
			continue
		}
		if p := pkgs[cur]; p != nil {
			for _, imp := range p.Imports {
				if _, seen := prev[imp]; !seen {
					prev[imp] = cur
					queue = append(queue, imp)
				}
			}
		}
	}
	return found
}

// local returns path relative to the module when it is inside it.
func local(path string) (string, bool) {
	if path == module {
		return ".", true
	}
	rel, ok := strings.CutPrefix(path, module+"/")
	return rel, ok
}

// name is how the table writes a path: relative inside the module.
func name(path string) string {
	if rel, ok := local(path); ok {
		return rel
	}
	return path
}

func matchAny(patterns []string, path string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return match(p, path) })
}

func match(pattern, path string) bool {
	if pattern == "*" {
		return true
	}
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == base || strings.HasPrefix(path, base+"/")
	}
	return path == pattern
}

func join(a, b []string) []string { return append(slices.Clip(a), b...) }

func sortedKeys(m map[string]*pkg) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// TestCheck holds the checker itself to each kind of rule on a made-up
// graph, so that a checker that finds nothing cannot pass for a clean tree.
func TestCheck(t *testing.T) {
	m := func(rel string) string { return module + "/" + rel }
	graph := func(edges map[string][]string) map[string]*pkg {
		pkgs := map[string]*pkg{"fmt": {ImportPath: "fmt", Standard: true}}
		for from, to := range edges {
			pkgs[from] = &pkg{ImportPath: from, Imports: to}
			for _, d := range to {
				if pkgs[d] == nil {
					pkgs[d] = &pkg{ImportPath: d}
				}
			}
		}
		return pkgs
	}
	for _, tc := range []struct {
		name  string
		edges map[string][]string
		want  []string // substrings, one per expected message
	}{
		{"allowed", map[string][]string{
			m("agent/planner"):       {m("agent/model"), "fmt"},
			m("agent/model"):         {m("datapath")},
			m("datapath/ipvs"):       {m("datapath/ipset"), "github.com/moby/ipvs"},
			m("agent/source"):        {"k8s.io/client-go/informers"},
			m("agent/cmd/edgeproxy"): {m("agent"), "example.com/anything"},
		}, nil},
		{"not in the row", map[string][]string{
			m("agent/policychain"): {m("agent/state")},
		}, []string{"agent/policychain imports agent/state"}},
		{"transitive kubernetes in datapath", map[string][]string{
			m("datapath/recorder"): {m("datapath")},
			m("datapath"):          {"example.com/lib"},
			"example.com/lib":      {"k8s.io/apimachinery/pkg/types"},
		}, []string{"datapath imports example.com/lib", "datapath depends on k8s.io/apimachinery/pkg/types (datapath → example.com/lib → k8s.io/apimachinery/pkg/types)",
			"datapath/recorder depends on k8s.io/apimachinery/pkg/types (datapath/recorder → datapath → example.com/lib"}},
		{"agent in policy", map[string][]string{
			m("policy"): {m("policy/abi")}, m("policy/abi"): {m("agent/model")},
		}, []string{"policy/abi imports agent/model", "policy depends on agent/model", "policy/abi depends on agent/model"}},
		{"kubernetes in the core", map[string][]string{
			m("agent/planner"): {m("agent/source")}, m("agent/source"): {"k8s.io/api/core/v1"},
		}, []string{"agent/planner depends on k8s.io/api/core/v1 (agent/planner → agent/source → k8s.io/api/core/v1)"}},
		{"informers outside source", map[string][]string{
			m("agent"): {"k8s.io/client-go/tools/cache"},
		}, []string{"agent imports k8s.io/client-go/tools/cache: its row", "agent imports k8s.io/client-go/tools/cache: only agent/source"}},
		{"test helper in the binary", map[string][]string{
			m("agent/cmd/edgeproxy"): {m("modules/modbuild")},
		}, []string{"agent/cmd/edgeproxy imports modules/modbuild: test helpers"}},
		{"package in no row", map[string][]string{
			m("agent/newthing"): nil,
		}, []string{"agent/newthing is in 0 rows"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := check(graph(tc.edges))
			if len(got) != len(tc.want) {
				t.Fatalf("check found %d problems, want %d:\n%s", len(got), len(tc.want), strings.Join(got, "\n"))
			}
			for _, w := range tc.want {
				if !slices.ContainsFunc(got, func(g string) bool { return strings.Contains(g, w) }) {
					t.Errorf("no problem says %q; got:\n%s", w, strings.Join(got, "\n"))
				}
			}
		})
	}
}
