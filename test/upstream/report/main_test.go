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
