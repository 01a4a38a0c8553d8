package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// junit writes a JUnit file shaped like the one the e2e suite writes.
func junit(t *testing.T, cases string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "junit_01.xml")
	doc := `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="4"><testsuite name="Kubernetes e2e suite">
<testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="1"></testcase>
<testcase name="[It] [sig-network] DNS should work" classname="Kubernetes e2e suite" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
` + cases + `</testsuite></testsuites>`
	if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReport(t *testing.T) {
	basic := `<testcase name="[It] [sig-network] Services should serve a basic endpoint from pods [Conformance]" status="passed" time="12.4"></testcase>
`
	twoNodes := `<testcase name="[It] [sig-network] Services should support externalTrafficPolicy=Local for type=NodePort" status="skipped" time="0.1"><skipped message="skipped - Requires at least 2 nodes (not -1)"></skipped></testcase>
`
	conntrack := `<testcase name="[It] [sig-network] Conntrack should be able to preserve UDP traffic when server pod cycles for a NodePort service" status="passed" time="20"></testcase>
`
	kp := junit(t, basic+twoNodes+conntrack+`<testcase name="[It] [sig-network] Services should implement service.kubernetes.io/headless" status="passed" time="30"></testcase>
`)
	ep := junit(t, basic+twoNodes+conntrack+`<testcase name="[It] [sig-network] Services should implement service.kubernetes.io/headless" status="failed" time="141.5"><failure message="" type="failed">[FAILED] waiting for service to be down timed out
In [It] at: service.go:2416</failure></testcase>
`)
	var out strings.Builder
	if err := run(&out, kp, ep); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"| kube-proxy | 3 | 0 | 1 |",
		"| edgeproxy | 2 | 1 | 1 |",
		"| Conntrack should be able to preserve UDP traffic when server pod cycles for a NodePort service | pass (20s) | pass (20s) |",
		"| should implement service.kubernetes.io/headless | pass (30s) | **FAIL** (142s): [FAILED] waiting for service to be down timed out |",
		"| should serve a basic endpoint from pods [Conformance] | pass (12s) | pass (12s) |",
		"| should support externalTrafficPolicy=Local for type=NodePort | skipped: Requires at least 2 nodes (not -1) | skipped: Requires at least 2 nodes (not -1) |",
	} {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	// The difference first, what ran next, what both skipped last; nothing
	// but the tier's tests.
	headless := strings.Index(got, "| should implement service.kubernetes.io/headless")
	basicRow := strings.Index(got, "| should serve a basic endpoint")
	skipped := strings.Index(got, "| should support externalTrafficPolicy=Local")
	if !(headless < basicRow && basicRow < skipped) {
		t.Errorf("rows out of order (%d, %d, %d):\n%s", headless, basicRow, skipped, got)
	}
	if strings.Contains(got, "DNS") || strings.Contains(got, "BeforeSuite") {
		t.Errorf("report lists tests other than the tier's:\n%s", got)
	}
}

func TestReportMissingFile(t *testing.T) {
	var out strings.Builder
	if err := run(&out, filepath.Join(t.TempDir(), "none.xml"), ""); err == nil {
		t.Fatal("a missing JUnit file was not an error")
	}
}

func TestJudge(t *testing.T) {
	const (
		basic    = "[sig-network] Services should serve a basic endpoint from pods [Conformance]"
		extIP    = "[sig-network] Services should be possible to connect to a service via ExternalIP when the external IP is not assigned to a node"
		headless = "[sig-network] Services should implement service.kubernetes.io/headless"
		twoNodes = "[sig-network] Services should support externalTrafficPolicy=Local for type=NodePort"
	)
	pass, fail, skip := result{state: "passed"}, result{state: "failed"}, result{state: "skipped"}
	expect := map[string]string{extIP: "externalIPs are opt-in"}
	for _, c := range []struct {
		name   string
		kp, ep map[string]result
		expect map[string]string
		want   []string // substrings, one per problem, in order
	}{
		{"the listed difference only", map[string]result{basic: pass, extIP: pass, twoNodes: skip}, map[string]result{basic: pass, extIP: fail, twoNodes: skip}, expect, nil},
		{"without the list it fails", map[string]result{basic: pass, extIP: pass}, map[string]result{basic: pass, extIP: fail}, nil, []string{"passes with kube-proxy, failed with edgeproxy: " + extIP}},
		{"another difference", map[string]result{basic: pass, extIP: pass, headless: pass}, map[string]result{basic: pass, extIP: fail, headless: fail}, expect, []string{"failed with edgeproxy: " + headless}},
		{"a listed difference gone", map[string]result{basic: pass, extIP: pass}, map[string]result{basic: pass, extIP: pass}, expect, []string{"edgeproxy passes it now"}},
		{"a listed test that did not run", map[string]result{basic: pass}, map[string]result{basic: pass}, expect, []string{"kube-proxy did not pass it (not run)"}},
		{"fails with both", map[string]result{basic: fail, extIP: pass}, map[string]result{basic: fail, extIP: fail}, expect, []string{"harness defect"}},
		{"missing from edgeproxy's run", map[string]result{basic: pass, headless: pass, extIP: pass}, map[string]result{basic: pass, extIP: fail}, expect, []string{"not run with edgeproxy: " + headless}},
		{"edgeproxy only", map[string]result{extIP: pass}, map[string]result{basic: pass, extIP: fail}, expect, []string{"ran with edgeproxy only: " + basic}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := judge(c.kp, c.ep, c.expect)
			if len(got) != len(c.want) {
				t.Fatalf("got %d problems %q, want %d", len(got), got, len(c.want))
			}
			for i, w := range c.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("problem %d is %q, want it to say %q", i, got[i], w)
				}
			}
		})
	}
}

func TestExpectedDifferencesFile(t *testing.T) {
	expect, err := readExpect("../expected-differences")
	if err != nil {
		t.Fatal(err)
	}
	if len(expect) == 0 {
		t.Fatal("the shipped list is empty: the ExternalIP difference is deliberate with the shipped config")
	}
	for name := range expect {
		if !strings.HasPrefix(name, "[sig-network] ") {
			t.Errorf("%q is not a full test name", name)
		}
	}
	bad := filepath.Join(t.TempDir(), "bad")
	if err := os.WriteFile(bad, []byte("[sig-network] Services a test without a reason\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readExpect(bad); err == nil {
		t.Error("a line without a reason was accepted")
	}
}
