package conformance

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/test/agenttest"
	"github.com/edgeproxy/edgeproxy/test/cluster"
	"github.com/edgeproxy/edgeproxy/test/proxies"
)

// anchors are kube-proxy outcomes the world must produce, so that a broken
// world (nothing answers under either proxy) cannot pass as "same".
var anchors = map[string]string{
	"cip/clusterip/pod/v4/legacy":           "l1,r1 from cpod",
	"cip/clusterip/pod/v6/nft":              "l1,r1 from cpod",
	"cip-no-endpoints/clusterip/pod/v4/nft": "refused",
	"np/np/ext/v4/legacy":                   "l1,r1 from node/br,node/remote-link",
	"cip/clusterip/pod/v4/ipvs":             "l1,r1 from cpod",
	"cip/clusterip/pod/v6/ipvs":             "l1,r1 from cpod",
}

func TestMatrix(t *testing.T) {
	gate.Root(t)
	gate.Binaries(t, "ip", "iptables-legacy", "iptables-nft", "ip6tables-legacy", "ip6tables-nft", "nft", "conntrack", "sysctl")
	kp, err := cluster.BinPath(cluster.KubeProxyBinary)
	if err != nil {
		gate.Skip(t, err.Error())
	}
	bins := Binaries{KubeProxy: kp, EdgeProxy: agenttest.Binary(t)}
	diffs := readRules(t, "DIFFERENCES.md")
	bugs := readRules(t, "KNOWN_BUGS.md")

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	w := NewWorld(ctx, t)
	t.Logf("world ready in %s", time.Since(start).Round(time.Millisecond))

	var rows []row
	for _, backend := range Backends {
		rows = append(rows, w.matrix(ctx, t, bins, backend, diffs, bugs)...)
	}
	report(t, rows, diffs, bugs)
	t.Logf("matrix: %d cells in %s", len(rows), time.Since(start).Round(time.Second))
}

// matrix runs every profile's cells under both proxies, one at a time, on
// one backend, and judges each cell.
func (w *World) matrix(ctx context.Context, t *testing.T, bins Binaries, backend string, diffs, bugs []Rule) []row {
	t.Helper()
	var rows []row
	for _, profile := range Profiles() {
		cells := Cells(profile, backend)
		res := map[proxies.Kind]map[string]Outcome{}
		for _, kind := range []proxies.Kind{proxies.KubeProxy, proxies.EdgeProxy} {
			runStart := time.Now()
			out, err := w.Run(ctx, kind, bins, profile, backend, cells)
			if err != nil {
				t.Fatalf("%s on %s (%s): %v", kind, backend, profileName(profile), err)
			}
			t.Logf("%s on %s (%s): %d cells in %s", kind, backend, profileName(profile), len(cells), time.Since(runStart).Round(time.Millisecond))
			res[kind] = out
		}
		for _, c := range cells {
			rows = append(rows, judge(c.Key(), res[proxies.KubeProxy][c.Key()], res[proxies.EdgeProxy][c.Key()], diffs, bugs))
		}
	}
	return rows
}

// row is one line of the printed matrix.
type row struct {
	key, kube, edge string
	mark            string // ✔ same, ≈ allowed difference, ! known bug, ✘ divergence
	rule            Rule
}

func judge(key string, kube, edge Outcome, diffs, bugs []Rule) row {
	r := row{key: key, kube: kube.String(), edge: edge.String(), mark: "✔"}
	if r.kube == r.edge {
		return r
	}
	if rule, ok := matchRule(diffs, key); ok {
		r.mark, r.rule = "≈", rule
	} else if rule, ok := matchRule(bugs, key); ok {
		r.mark, r.rule = "!", rule
	} else {
		r.mark = "✘"
	}
	return r
}

func report(t *testing.T, rows []row, diffs, bugs []Rule) {
	var b strings.Builder
	width := 0
	for _, r := range rows {
		width = max(width, len(r.key))
	}
	kw := 0
	for _, r := range rows {
		kw = max(kw, len(r.kube))
	}
	fmt.Fprintf(&b, "%-*s  %-*s  %s\n", width+2, "cell (shape/frontend/position/family/backend)", kw, "kube-proxy", "edgeproxy")
	count := map[string]int{}
	for _, r := range rows {
		count[r.mark]++
		edge := r.edge
		if r.mark == "✔" {
			edge = "="
		}
		fmt.Fprintf(&b, "%s %-*s  %-*s  %s\n", r.mark, width, r.key, kw, r.kube, edge)
	}
	fmt.Fprintf(&b, "\n%d cells: %d ✔ same, %d ≈ listed in DIFFERENCES.md, %d ! listed in KNOWN_BUGS.md, %d ✘ divergent\n",
		len(rows), count["✔"], count["≈"], count["!"], count["✘"])
	fmt.Print(b.String())
	if dir := os.Getenv("EDGEPROXY_CONFORMANCE_OUT"); dir != "" {
		if err := os.WriteFile(filepath.Join(dir, "matrix.txt"), []byte(b.String()), 0o644); err != nil {
			t.Errorf("write matrix: %v", err)
		}
	}

	for _, r := range rows {
		if strings.Contains(r.kube, "harness:") || strings.Contains(r.edge, "harness:") {
			t.Errorf("%s: harness error: kube-proxy %q, edgeproxy %q", r.key, r.kube, r.edge)
		}
		if r.mark == "✘" {
			t.Errorf("%s: kube-proxy %q, edgeproxy %q (not in DIFFERENCES.md or KNOWN_BUGS.md)", r.key, r.kube, r.edge)
		}
	}
	byKey := map[string]row{}
	backends := map[string]bool{}
	for _, r := range rows {
		byKey[r.key] = r
		backends[path.Base(r.key)] = true
	}
	for k, want := range anchors {
		if !backends[path.Base(k)] {
			continue // another run's
		}
		if r, ok := byKey[k]; !ok || r.kube != want {
			t.Errorf("anchor %s: kube-proxy %q, want %q: the world is broken", k, r.kube, want)
		}
	}
	// A rule no divergent cell needs is stale: a known bug that is fixed
	// must leave KNOWN_BUGS.md; a difference that no longer shows is noted.
	// Rules for cells of another run (the other matrix) are not judged.
	used, ours := map[string]bool{}, map[string]bool{}
	for _, r := range rows {
		if r.mark == "≈" || r.mark == "!" {
			used[r.rule.Pattern] = true
		}
		for _, rule := range append(slices.Clip(bugs), diffs...) {
			if rule.Match(r.key) {
				ours[rule.Pattern] = true
			}
		}
	}
	for _, rule := range bugs {
		if ours[rule.Pattern] && !used[rule.Pattern] {
			t.Errorf("KNOWN_BUGS.md: %s matches no divergent cell any more: remove it", rule.Pattern)
		}
	}
	for _, rule := range diffs {
		if ours[rule.Pattern] && !used[rule.Pattern] {
			t.Logf("DIFFERENCES.md: %s matches no divergent cell in this run", rule.Pattern)
		}
	}
}

func readRules(t *testing.T, file string) []Rule {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	rules, err := ParseRules(string(b))
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return rules
}

// TestCells checks the matrix's shape without running it: enough cells,
// unique keys, every rule file parses and every pattern matches a cell.
func TestCells(t *testing.T) {
	keys := map[string]bool{}
	for _, b := range append(slices.Clip(Backends), BackendIPVS) {
		for _, p := range Profiles() {
			for _, c := range Cells(p, b) {
				if keys[c.Key()] {
					t.Errorf("duplicate cell %s", c.Key())
				}
				keys[c.Key()] = true
			}
		}
	}
	if len(keys) < 150 {
		t.Errorf("%d cells, want at least 150", len(keys))
	}
	t.Logf("%d cells", len(keys))
	for _, f := range []string{"DIFFERENCES.md", "KNOWN_BUGS.md"} {
		for _, r := range readRules(t, f) {
			hit := false
			for k := range keys {
				if r.Match(k) {
					hit = true
					break
				}
			}
			if !hit {
				t.Errorf("%s: %s matches no cell", f, r.Pattern)
			}
		}
	}
}

func TestParseRules(t *testing.T) {
	rules, err := ParseRules("prose\n- `extip*/*/*/*/*` — externalIPs are opt-in\n  - `a/b/c/d/e`: why\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) != 2 || rules[0].Reason != "externalIPs are opt-in" || rules[1].Reason != "why" {
		t.Fatalf("rules = %+v", rules)
	}
	if !rules[0].Match("extip-etp-local/extip/pod/v4/nft") || rules[0].Match("np/np/pod/v4/nft") {
		t.Error("pattern matching is wrong")
	}
	for _, bad := range []string{"- `a/b` too short", "- `a/b/c/d/[` bad", "- `a/b/c/d/e`", "- `a/b/c/d/e"} {
		if _, err := ParseRules(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
