// Command report turns the JUnit files of the test/upstream runs into the
// markdown table of RESULTS.md: one row per test that ran in either run,
// with kube-proxy's result and edgeproxy's side by side, and the tests
// where they differ first. Then it judges the pair and exits 1 when the
// judgement fails (after writing the table): every test kube-proxy passes
// must pass with edgeproxy, except those the -expect file names (a
// deliberate difference, each with its reason), and each of those must
// still differ; a test that fails with kube-proxy is a harness defect.
//
//	go -C test run ./upstream/report -kube-proxy KP.xml -edgeproxy EP.xml [-expect FILE]
package main

import (
	"cmp"
	"encoding/xml"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// suites is the subset of the JUnit that ginkgo writes for the e2e suite.
type suites struct {
	Suites []struct {
		Cases []testCase `xml:"testcase"`
	} `xml:"testsuite"`
}

type testCase struct {
	Name    string  `xml:"name,attr"`
	Time    float64 `xml:"time,attr"`
	Skipped *struct {
		Message string `xml:"message,attr"`
	} `xml:"skipped"`
	Failure *message `xml:"failure"`
	Error   *message `xml:"error"`
}

// message is a failure or error: ginkgo leaves the attribute empty and
// writes the report in the text.
type message struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

// reason is the line that says why: the one ginkgo starts with [FAILED] or
// [PANICKED], else the first.
func (m *message) reason() string {
	for _, l := range strings.Split(m.Message+"\n"+m.Text, "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "[FAILED]") || strings.HasPrefix(l, "[PANICKED]") {
			return firstLine(l)
		}
	}
	return firstLine(strings.TrimSpace(m.Message + "\n" + m.Text))
}

type result struct {
	state string // passed, failed, skipped, "" (not in the run)
	secs  float64
	why   string
}

func main() {
	kp := flag.String("kube-proxy", "", "JUnit of the kube-proxy run")
	ep := flag.String("edgeproxy", "", "JUnit of the edgeproxy run")
	expectPath := flag.String("expect", "", "the deliberate differences: lines \"<full test name> | <reason>\"")
	flag.Parse()
	expect, err := readExpect(*expectPath)
	if err == nil {
		err = run(os.Stdout, *kp, *ep)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(2)
	}
	kpr, _ := read(*kp)
	epr, _ := read(*ep)
	if problems := judge(kpr, epr, expect); len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(os.Stderr, "report:", p)
		}
		os.Exit(1)
	}
}

// readExpect reads the deliberate differences: one "<full test name> |
// <reason>" per line; blank lines and lines starting with # are
// comments. A name is matched exactly, never as a pattern.
func readExpect(path string) (map[string]string, error) {
	out := map[string]string{}
	if path == "" {
		return out, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	for i, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		name, why, ok := strings.Cut(l, " | ")
		if !ok || strings.TrimSpace(why) == "" {
			return nil, fmt.Errorf("%s:%d: want \"<full test name> | <reason>\"", path, i+1)
		}
		out[strings.TrimSpace(name)] = strings.TrimSpace(why)
	}
	return out, nil
}

// judge lists what fails the pair: a test kube-proxy passed that
// edgeproxy did not (unless expected), an expected difference that
// edgeproxy passes or that did not run, and a test that failed with
// kube-proxy (a harness defect: the baseline must pass what it runs).
// Names sort the list.
func judge(kp, ep map[string]result, expect map[string]string) []string {
	var out []string
	for n, k := range kp {
		e := ep[n]
		_, expected := expect[n]
		switch {
		case k.state == "failed":
			out = append(out, fmt.Sprintf("fails with kube-proxy (a harness defect): %s", n))
		case k.state == "passed" && e.state != "passed" && !expected:
			out = append(out, fmt.Sprintf("passes with kube-proxy, %s with edgeproxy: %s", cmp.Or(e.state, "not run"), n))
		}
	}
	for n := range ep {
		if _, ok := kp[n]; !ok {
			out = append(out, fmt.Sprintf("ran with edgeproxy only: %s", n))
		}
	}
	for n := range expect {
		switch {
		case kp[n].state != "passed":
			out = append(out, fmt.Sprintf("listed as a deliberate difference, but kube-proxy did not pass it (%s): %s", cmp.Or(kp[n].state, "not run"), n))
		case ep[n].state == "passed":
			out = append(out, fmt.Sprintf("listed as a deliberate difference, but edgeproxy passes it now (remove it from the list): %s", n))
		}
	}
	slices.Sort(out)
	return out
}

func read(path string) (map[string]result, error) {
	out := map[string]result{}
	if path == "" {
		return out, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s suites
	if err := xml.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for _, su := range s.Suites {
		for _, c := range su.Cases {
			name := strings.TrimPrefix(c.Name, "[It] ")
			if !slices.ContainsFunc(tier, func(p string) bool { return strings.HasPrefix(name, p) }) {
				continue // other tests, BeforeSuite, AfterSuite, ReportAfterSuite
			}
			r := result{state: "passed", secs: c.Time}
			switch {
			case c.Skipped != nil:
				r.state, r.why = "skipped", strings.TrimPrefix(firstLine(c.Skipped.Message), "skipped - ")
			case c.Failure != nil:
				r.state, r.why = "failed", c.Failure.reason()
			case c.Error != nil:
				r.state, r.why = "failed", c.Error.reason()
			}
			out[name] = r
		}
	}
	return out, nil
}

// tier is what the tier runs: the Services tests on one node, and with
// two nodes also the Conntrack and the Networking Granular Checks of
// Services. Rows drop the "[sig-network] Services " of the first.
var tier = []string{
	"[sig-network] Services ",
	"[sig-network] Conntrack ",
	"[sig-network] Networking Granular Checks: Services ",
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > 120 {
		s = s[:120] + "…"
	}
	return strings.ReplaceAll(s, "|", "\\|")
}

func cell(r result) string {
	switch r.state {
	case "":
		return "—"
	case "skipped":
		return "skipped: " + r.why
	case "passed":
		return fmt.Sprintf("pass (%.0fs)", r.secs)
	}
	return fmt.Sprintf("**FAIL** (%.0fs): %s", r.secs, r.why)
}

func run(w io.Writer, kpPath, epPath string) error {
	kp, err := read(kpPath)
	if err != nil {
		return err
	}
	ep, err := read(epPath)
	if err != nil {
		return err
	}
	var names []string
	for n := range kp {
		names = append(names, n)
	}
	for n := range ep {
		if _, ok := kp[n]; !ok {
			names = append(names, n)
		}
	}
	// Differences first, then what ran, then what both skipped; by name.
	rank := func(n string) int {
		switch {
		case kp[n].state != ep[n].state:
			return 0
		case kp[n].state != "skipped":
			return 1
		}
		return 2
	}
	slices.SortFunc(names, func(a, b string) int {
		if ra, rb := rank(a), rank(b); ra != rb {
			return ra - rb
		}
		return strings.Compare(a, b)
	})
	count := func(m map[string]result, state string) int {
		n := 0
		for _, r := range m {
			if r.state == state {
				n++
			}
		}
		return n
	}
	fmt.Fprintf(w, "| | passed | failed | skipped |\n|---|---|---|---|\n")
	fmt.Fprintf(w, "| kube-proxy | %d | %d | %d |\n", count(kp, "passed"), count(kp, "failed"), count(kp, "skipped"))
	fmt.Fprintf(w, "| edgeproxy | %d | %d | %d |\n\n", count(ep, "passed"), count(ep, "failed"), count(ep, "skipped"))
	fmt.Fprintf(w, "| test | kube-proxy | edgeproxy |\n|---|---|---|\n")
	for _, n := range names {
		fmt.Fprintf(w, "| %s | %s | %s |\n", strings.TrimPrefix(strings.TrimPrefix(n, tier[0]), "[sig-network] "), cell(kp[n]), cell(ep[n]))
	}
	return nil
}
