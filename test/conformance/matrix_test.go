package conformance

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/test/agenttest"
	"github.com/edgeproxy/edgeproxy/test/cluster"
	"github.com/edgeproxy/edgeproxy/test/proxies"
)

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

	seed := orderSeed(t)
	var rows []row
	for i, backend := range Backends {
		rows = append(rows, w.matrix(ctx, t, bins, backend, seed+i*len(Profiles()))...)
	}
	report(t, rows, diffs, bugs)
	t.Logf("matrix: %d cells in %s", len(rows), time.Since(start).Round(time.Second))
}

// matrix runs every profile's cells under both proxies, one at a time, on
// one backend. Which proxy runs first alternates from one profile to the
// next, starting from seed (see orderSeed).
func (w *World) matrix(ctx context.Context, t *testing.T, bins Binaries, backend string, seed int) []row {
	t.Helper()
	var rows []row
	for i, profile := range Profiles() {
		cells := Cells(profile, backend)
		res := map[proxies.Kind]map[string]Outcome{}
		for _, kind := range runOrder(seed + i) {
			runStart := time.Now()
			out, err := w.Run(ctx, kind, bins, profile, backend, cells)
			if err != nil {
				t.Fatalf("%s on %s (%s): %v", kind, backend, profileName(profile), err)
			}
			t.Logf("%s on %s (%s): %d cells in %s", kind, backend, profileName(profile), len(cells), time.Since(runStart).Round(time.Millisecond))
			res[kind] = out
		}
		for _, c := range cells {
			rows = append(rows, row{key: c.Key(), kube: res[proxies.KubeProxy][c.Key()].String(), edge: res[proxies.EdgeProxy][c.Key()].String()})
		}
	}
	return rows
}

// runOrder is the order of the two proxies' runs for the n-th profile run:
// kube-proxy first when n is even. A proxy that leaves something behind
// that the reset misses, or that meets what the other left, shows in the
// column of whichever ran second, so the order must not be fixed.
func runOrder(n int) []proxies.Kind {
	if n%2 == 0 {
		return []proxies.Kind{proxies.KubeProxy, proxies.EdgeProxy}
	}
	return []proxies.Kind{proxies.EdgeProxy, proxies.KubeProxy}
}

// orderSeed is where runOrder starts: EDGEPROXY_CONFORMANCE_SEED when set
// (to repeat a run's order), else a counter in the cache directory
// (EDGEPROXY_CACHE, or the user's cache directory's edgeproxy/) that each
// run increments, so that consecutive runs start with the other proxy.
// It is logged either way.
// Each test has its own counter (TestMatrix and TestMatrixIPVS run one
// after the other in one go test).
func orderSeed(t *testing.T) int {
	t.Helper()
	if v := os.Getenv("EDGEPROXY_CONFORMANCE_SEED"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			t.Fatalf("EDGEPROXY_CONFORMANCE_SEED=%q: want a number", v)
		}
		t.Logf("proxy order: seed %d (EDGEPROXY_CONFORMANCE_SEED); %s first", n, runOrder(n)[0])
		return n
	}
	dir := os.Getenv("EDGEPROXY_CACHE")
	if dir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(base, "edgeproxy")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "conformance-runs-"+t.Name())
	n := 0
	if b, err := os.ReadFile(file); err == nil {
		n, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if err := os.WriteFile(file, []byte(strconv.Itoa(n+1)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("proxy order: seed %d (run counter %s; EDGEPROXY_CONFORMANCE_SEED=%d repeats it); %s first", n, file, n, runOrder(n)[0])
	return n
}

// row is one line of the printed matrix.
type row struct {
	key, kube, edge string
	mark            string // ✔ same, ≈ allowed difference, ! known bug, ✘ fails
	rule            Rule
	note            string // why a ✘ that is not a plain divergence fails
}

// judge marks a row. A listed cell passes only when edgeproxy shows the
// outcome its rule states and kube-proxy something else; a cell never
// probed fails, whatever the other column says.
func judge(r row, diffs, bugs []Rule) row {
	r.mark, r.rule, r.note = "✔", Rule{}, ""
	if r.kube == nothing || r.edge == nothing {
		r.mark, r.note = "✘", "probes never ran"
		return r
	}
	diff, inDiffs, wantDiff := matchRule(diffs, r.key, r.edge)
	bug, inBugs, wantBug := matchRule(bugs, r.key, r.edge)
	switch {
	case r.kube == r.edge && inDiffs:
		r.mark, r.rule, r.note = "✘", diff, "listed in DIFFERENCES.md but the same as kube-proxy"
	case r.kube == r.edge && inBugs:
		r.mark, r.rule, r.note = "✘", bug, "listed in KNOWN_BUGS.md but the same as kube-proxy"
	case r.kube == r.edge:
	case wantDiff:
		r.mark, r.rule = "≈", diff
	case wantBug:
		r.mark, r.rule = "!", bug
	case inDiffs:
		r.mark, r.rule, r.note = "✘", diff, "DIFFERENCES.md expects edgeproxy "+strconv.Quote(diff.Want)
	case inBugs:
		r.mark, r.rule, r.note = "✘", bug, "KNOWN_BUGS.md expects edgeproxy "+strconv.Quote(bug.Want)
	default:
		r.mark, r.note = "✘", "not in DIFFERENCES.md or KNOWN_BUGS.md"
	}
	return r
}

// report judges the rows, prints the matrix and fails the test on a
// ✘, a harness error, a broken anchor, a cell count off its pin, or a rule
// no cell of this run needs.
func report(t *testing.T, rows []row, diffs, bugs []Rule) {
	for i := range rows {
		rows[i] = judge(rows[i], diffs, bugs)
	}
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
	perBackend := map[string]int{}
	for _, r := range rows {
		count[r.mark]++
		perBackend[path.Base(r.key)]++
		edge := r.edge
		if r.mark == "✔" {
			edge = "="
		}
		if r.note != "" {
			edge += "  (" + r.note + ")"
		}
		fmt.Fprintf(&b, "%s %-*s  %-*s  %s\n", r.mark, width, r.key, kw, r.kube, edge)
	}
	var per []string
	for _, be := range slices.Sorted(maps.Keys(perBackend)) {
		per = append(per, fmt.Sprintf("%s %d", be, perBackend[be]))
	}
	fmt.Fprintf(&b, "\n%d cells (%s): %d ✔ same, %d ≈ listed in DIFFERENCES.md, %d ! listed in KNOWN_BUGS.md, %d ✘ failed\n",
		len(rows), strings.Join(per, ", "), count["✔"], count["≈"], count["!"], count["✘"])
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
			t.Errorf("%s: kube-proxy %q, edgeproxy %q: %s", r.key, r.kube, r.edge, r.note)
		}
	}
	for be, n := range perBackend {
		if want := CellCount[be]; n != want {
			t.Errorf("backend %s: %d cells judged, want %d (CellCount): a profile or shape did not run", be, n, want)
		}
	}
	checkAnchors(t, rows)
	// A rule no divergent cell of this run needs is stale: a known bug
	// that is fixed must leave KNOWN_BUGS.md, a difference that no longer
	// shows must leave DIFFERENCES.md. Rules for cells of another run (the
	// other matrix) are not judged.
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
	for file, rules := range map[string][]Rule{"KNOWN_BUGS.md": bugs, "DIFFERENCES.md": diffs} {
		for _, rule := range rules {
			if ours[rule.Pattern] && !used[rule.Pattern] {
				t.Errorf("%s: %s matches no divergent cell any more: remove it", file, rule.Pattern)
			}
		}
	}
}

// checkAnchors fails the test when kube-proxy's column misses an anchor
// (the world is broken: a route, a pod, the controller's hints), or when
// a shape of this run has no anchor at all.
func checkAnchors(t *testing.T, rows []row) {
	t.Helper()
	anchored := map[string]bool{} // shape/backend
	ran := map[string]bool{}
	for _, r := range rows {
		parts := strings.Split(r.key, "/")
		sb := parts[0] + "/" + parts[4]
		ran[sb] = true
		for pat, want := range Anchors {
			if ok, _ := path.Match(pat, r.key); !ok {
				continue
			}
			anchored[sb] = true
			if r.kube != want {
				t.Errorf("anchor %s: kube-proxy %q, want %q: the world is broken", r.key, r.kube, want)
			}
		}
	}
	for _, sb := range slices.Sorted(maps.Keys(ran)) {
		if !anchored[sb] {
			t.Errorf("%s: no anchor cell ran (Anchors)", sb)
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
	perBackend := map[string]int{}
	for _, b := range append(slices.Clip(Backends), BackendIPVS) {
		for _, p := range Profiles() {
			for _, c := range Cells(p, b) {
				if keys[c.Key()] {
					t.Errorf("duplicate cell %s", c.Key())
				}
				keys[c.Key()] = true
				perBackend[b]++
			}
		}
		if perBackend[b] != CellCount[b] {
			t.Errorf("backend %s: %d cells, CellCount pins %d: update it with the shapes", b, perBackend[b], CellCount[b])
		}
	}
	if len(CellCount) != len(perBackend) {
		t.Errorf("CellCount pins %d backends, the matrix has %d", len(CellCount), len(perBackend))
	}
	t.Logf("cells per backend: %v", perBackend)
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
	// Every shape has an anchor on every backend, and every anchor
	// names cells.
	for pat := range Anchors {
		if _, err := path.Match(pat, ""); err != nil || strings.Count(pat, "/") != 4 {
			t.Errorf("anchor %q: want a shape/frontend/position/family/backend pattern", pat)
		}
	}
	anchored := map[string]bool{}
	for k := range keys {
		parts := strings.Split(k, "/")
		for pat := range Anchors {
			if ok, _ := path.Match(pat, k); ok {
				anchored[parts[0]+"/"+parts[4]] = true
				anchored[pat] = true
			}
		}
	}
	for pat := range Anchors {
		if !anchored[pat] {
			t.Errorf("anchor %s matches no cell", pat)
		}
	}
	for _, s := range Shapes {
		for b := range perBackend {
			if !anchored[s.Name+"/"+b] {
				t.Errorf("shape %s has no anchor on backend %s (Anchors)", s.Name, b)
			}
		}
	}
}

func TestJudge(t *testing.T) {
	diffs := []Rule{{Pattern: "lb-etp-local*/lb/node/*/ipvs", Want: "l1 from node/ext-link", Reason: "why"}}
	bugs := []Rule{{Pattern: "np/np/ext/v6/*", Want: "timeout", Reason: "bug"}}
	for _, c := range []struct {
		key, kube, edge, mark string
	}{
		{"cip/clusterip/pod/v4/nft", "l1,r1 from cpod", "l1,r1 from cpod", "✔"},
		{"cip/clusterip/pod/v4/nft", "l1,r1 from cpod", "l1 + timeout", "✘"},
		// Two cells whose probes never ran are not the same.
		{"cip/clusterip/pod/v4/nft", nothing, nothing, "✘"},
		{"cip/clusterip/pod/v4/nft", "l1,r1 from cpod", nothing, "✘"},
		// A listed cell passes only with the outcome its rule states.
		{"lb-etp-local/lb/node/v4/ipvs", "l1,r1 from lb-etp-local/lb", "l1 from node/ext-link", "≈"},
		{"lb-etp-local/lb/node/v4/ipvs", "l1,r1 from lb-etp-local/lb", "timeout", "✘"},
		{"lb-etp-local/lb/node/v4/ipvs", "l1 from node/ext-link", "l1 from node/ext-link", "✘"},
		{"np/np/ext/v6/nft", "l1,r1 from ext", "timeout", "!"},
		{"np/np/ext/v6/nft", "l1,r1 from ext", "refused", "✘"},
		{"np/np/ext/v6/nft", "timeout", "timeout", "✘"},
	} {
		r := judge(row{key: c.key, kube: c.kube, edge: c.edge}, diffs, bugs)
		if r.mark != c.mark {
			t.Errorf("%s: kube-proxy %q, edgeproxy %q: %s (%s), want %s", c.key, c.kube, c.edge, r.mark, r.note, c.mark)
		}
	}
}

func TestSticky(t *testing.T) {
	// Affinity cells compare the source the endpoint saw, not only that
	// one endpoint answered.
	a := Outcome{Endpoints: []string{"l1"}, Sources: []string{"cpod"}, Sticky: true}
	b := Outcome{Endpoints: []string{"r1"}, Sources: []string{nodeLink}, Sticky: true}
	if a.String() == b.String() {
		t.Errorf("sticky outcomes with sources cpod and %s print the same: %q", nodeLink, a.String())
	}
	if got, want := (Outcome{}).String(), nothing; got != want {
		t.Errorf("empty outcome = %q, want %q", got, want)
	}
}

func TestRunOrder(t *testing.T) {
	for n := range 4 {
		if runOrder(n)[0] == runOrder(n + 1)[0] {
			t.Errorf("runs %d and %d start with the same proxy, %s", n, n+1, runOrder(n)[0])
		}
	}
}

func TestParseRules(t *testing.T) {
	rules, err := ParseRules("prose\n- `extip*/*/*/*/*` → `timeout` — externalIPs are opt-in\n  - `a/b/c/d/e` → `l1 from node/br + refused`: why\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) != 2 || rules[0].Reason != "externalIPs are opt-in" || rules[0].Want != "timeout" ||
		rules[1].Reason != "why" || rules[1].Want != "l1 from node/br + refused" {
		t.Fatalf("rules = %+v", rules)
	}
	if !rules[0].Match("extip-etp-local/extip/pod/v4/nft") || rules[0].Match("np/np/pod/v4/nft") {
		t.Error("pattern matching is wrong")
	}
	for _, bad := range []string{"- `a/b` → `x` too short", "- `a/b/c/d/[` → `x` bad", "- `a/b/c/d/e` → `x`", "- `a/b/c/d/e",
		"- `a/b/c/d/e` no outcome", "- `a/b/c/d/e` → `` empty", "- `a/b/c/d/e` → `timeout why", "- `a/b/c/d/e` → `nothing` why"} {
		if _, err := ParseRules(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
