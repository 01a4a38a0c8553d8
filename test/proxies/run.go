package proxies

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// StartLogged starts args (a proxy's command line) through do — the node
// namespace's Do, so that the process lives in it — with env, its output
// appended to logPath. When t ends the process is stopped and, if t
// failed, the log's last 60 lines are printed.
func StartLogged(t testing.TB, do func(func() error) error, name, logPath string, env []string, args ...string) *Process {
	t.Helper()
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.Close()
		if t.Failed() {
			out, _ := os.ReadFile(logPath)
			t.Logf("%s log (tail):\n%s", name, Tail(string(out), 60))
		}
	})
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = env
	var p *Process
	if err := do(func() (err error) { p, err = Start(name, cmd, logPath); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

// Tail is the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Sample metrics of kube-proxy (and edgeproxy, which keeps the names),
// each labelled with ip_family.
const (
	MetricSyncTimestamp  = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
	MetricSyncCount      = "kubeproxy_sync_proxy_rules_duration_seconds_count"
	MetricConntrackSwept = "kubeproxy_conntrack_reconciler_sync_duration_seconds_count"
)

// Nonzero reports whether metrics (Prometheus' text format) holds the
// sample name{ip_family="family"} with a value other than 0.
func Nonzero(metrics, name, family string) bool {
	prefix := name + `{ip_family="` + family + `"} `
	for _, line := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			return strings.TrimSpace(v) != "0"
		}
	}
	return false
}
