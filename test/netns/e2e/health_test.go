package e2e_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/test/proxies"
)

// The health states of issue 26: what /healthz and /livez answer while a
// proxy starts without its API server, once synced, while its syncs fail
// with a change queued (stale), once they succeed again, and while the
// API server is gone. kube-proxy (pkg/proxy/healthcheck/proxy_health.go)
// is healthy unless a change it queued has waited longer than its health
// timeout (twice its sync period) without a successful sync; it serves
// nothing until it has read its Node from the API server.

// healthSyncPeriod is both proxies' sync period; kube-proxy's health
// timeout is twice it, and edgeproxy's sync.healthTimeout is set to the
// same.
const healthSyncPeriod = 5 * time.Second

// healthAddr is where both proxies serve /healthz and /livez in the node.
const healthAddr = "127.0.0.1:10256"

// healthStates are the states each proxy is put in, in this order.
var healthStates = []string{"starting", "synced", "stale", "released", "apiserver-gone", "apiserver-back"}

// healthWorld is a node whose one way to the API server can be dropped,
// and a private xtables lock the test can hold: both proxies use the
// iptables-legacy tools, which take the lock named by XTABLES_LOCKFILE
// (set for the whole test, so that no other test's iptables waits on it).
type healthWorld struct {
	node     *netns.Node
	w        *apiWorld
	path     string // the legacy backend's tools, first in PATH
	lockFile string
	settings proxies.Settings
	pn       proxies.Node
	vip      int // the last Service address used, 10.96.26.vip
}

// healthAnswer is what a GET of path answered: "no answer" when nothing
// accepted the connection, else the status code and the body fields both
// proxies give ("healthy"; "nodeEligible" too for /healthz, which
// kube-proxy leaves out of /livez).
func (h *healthWorld) healthAnswer(path string) string {
	var conn net.Conn
	if err := h.node.Do(func() (err error) { conn, err = net.DialTimeout("tcp", healthAddr, time.Second); return err }); err != nil {
		return "no answer"
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, healthAddr); err != nil {
		return "no answer: " + err.Error()
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return "no answer: " + err.Error()
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return fmt.Sprintf("%d, body: %v", resp.StatusCode, err)
	}
	var v struct {
		Healthy      *bool `json:"healthy"`
		NodeEligible *bool `json:"nodeEligible"`
	}
	if err := json.Unmarshal(body, &v); err != nil || v.Healthy == nil {
		return fmt.Sprintf("%d, body %q", resp.StatusCode, body)
	}
	out := fmt.Sprintf("%d healthy=%t", resp.StatusCode, *v.Healthy)
	if path == "/healthz" && v.NodeEligible != nil {
		out += fmt.Sprintf(" nodeEligible=%t", *v.NodeEligible)
	}
	return out
}

// answers is both endpoints' answer now.
func (h *healthWorld) answers() string {
	return "healthz " + h.healthAnswer("/healthz") + "; livez " + h.healthAnswer("/livez")
}

// seen samples answers every 250ms for d and returns the distinct ones in
// the order they came.
func (h *healthWorld) seen(d time.Duration) []string {
	out, _ := h.seenUntil(d, 0, d, func() bool { return true })
	return out
}

// seenUntil samples answers as seen does, for at least d, and on until
// done has held for after, for at most limit; it reports whether done
// held.
func (h *healthWorld) seenUntil(d, after, limit time.Duration, done func() bool) ([]string, bool) {
	var out []string
	start := time.Now()
	var since time.Time // when done first held
	for ; time.Since(start) < limit; time.Sleep(250 * time.Millisecond) {
		if a := h.answers(); !slices.Contains(out, a) {
			out = append(out, a)
		}
		if since.IsZero() && done() {
			since = time.Now()
		}
		if !since.IsZero() && time.Since(start) >= d && time.Since(since) >= after {
			break
		}
	}
	return out, !since.IsZero()
}

// until polls answers until ok accepts one, for at most d, and returns
// the last answer and how long it took.
func (h *healthWorld) until(d time.Duration, ok func(string) bool) (string, time.Duration) {
	start := time.Now()
	var a string
	for time.Since(start) < d {
		if a = h.answers(); ok(a) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	return a, time.Since(start).Round(100 * time.Millisecond)
}

// drop inserts (-I) or deletes (-D) the blackhole between the node and
// the API server: every packet dropped in the node, nothing reset. The
// rules are iptables-nft's, apart from the proxies' legacy tables.
func (h *healthWorld) drop(t *testing.T, op string) {
	t.Helper()
	for _, rule := range [][]string{{"INPUT", "-s", h.w.hostIP.String()}, {"OUTPUT", "-d", h.w.hostIP.String()}} {
		args := append([]string{op, rule[0]}, append(rule[1:], "-j", "DROP")...)
		if out, err := h.node.Run("iptables-nft", args...); err != nil {
			t.Fatalf("iptables-nft %v: %v: %s", args, err, out)
		}
	}
}

// holdLock takes the xtables lock the proxies' iptables tools use, as
// another program writing rules would; the returned function releases it.
func (h *healthWorld) holdLock(t *testing.T) (release func()) {
	t.Helper()
	f, err := os.OpenFile(h.lockFile, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	released := false
	release = func() {
		if !released {
			released = true
			_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
			f.Close()
		}
	}
	t.Cleanup(release)
	return release
}

// service creates a new ClusterIP Service selecting the pod: a change
// each proxy must program.
func (h *healthWorld) service(t *testing.T) netip.Addr {
	t.Helper()
	h.vip++
	vip := netip.AddrFrom4([4]byte{10, 96, 26, byte(h.vip)})
	h.w.createService(t, clusterIPService(fmt.Sprintf("web-%d", h.vip), vip, map[string]string{"app": "web"},
		servicePort("tcp", corev1.ProtocolTCP, 80, podPort)))
	return vip
}

// programmed reports whether vip is in the nat table of the proxies'
// backend.
func (h *healthWorld) programmed(vip netip.Addr) error {
	out, err := h.node.Run("iptables-legacy-save", "-t", "nat")
	if err != nil {
		return err
	}
	if !strings.Contains(out, vip.String()+"/32") {
		return fmt.Errorf("%s not in the nat table", vip)
	}
	return nil
}

// run puts the proxy that start starts (with its log at logPath)
// through every state and returns what it answered in each: the distinct
// answers, in the order they came. synced, if not nil, says whether the
// proxy has finished its first sync in every family it runs.
func (h *healthWorld) run(t *testing.T, name, logPath string, start func() *proxies.Process, synced func() error) map[string][]string {
	t.Helper()
	got := map[string][]string{}
	timeout := 2 * healthSyncPeriod
	log := func(state, format string, args ...any) {
		t.Logf("%s %s: %s: %s", name, state, strings.Join(got[state], " then "), fmt.Sprintf(format, args...))
	}
	healthy := func(a string) bool { return strings.HasPrefix(a, "healthz 200") }

	// Starting: the API server unreachable from the start, for longer
	// than the health timeout.
	h.drop(t, "-I")
	p := start()
	got["starting"] = h.seen(timeout + 3*time.Second)
	log("starting", "sampled for %v with the API server unreachable", timeout+3*time.Second)
	h.drop(t, "-D")

	// Synced: the API server back, the Service programmed.
	vip := netip.AddrFrom4([4]byte{10, 96, 26, 1})
	back := time.Now()
	waitFor(t, 3*time.Minute, name+" programs the Service once the API server is back", func() error {
		if err := p.Exited(); err != nil {
			t.Fatal(err)
		}
		if err := h.programmed(vip); err != nil || synced == nil {
			return err
		}
		return synced()
	})
	a, took := h.until(time.Minute, healthy)
	got["synced"] = []string{a}
	log("synced", "the Service programmed %v after the API server came back, this answer %v later", time.Since(back).Round(100*time.Millisecond), took)

	// Stale: the xtables lock held, so that every sync fails, and a
	// Service added.
	release := h.holdLock(t)
	stale := h.service(t)
	a, took = h.until(6*timeout, func(a string) bool { return !healthy(a) })
	got["stale"] = []string{a}
	log("stale", "%v after the Service was added with the xtables lock held", took)
	if err := h.programmed(stale); err == nil {
		t.Errorf("%s programmed %s while the xtables lock was held: the syncs did not fail", name, stale)
	}

	// Released: the lock free again.
	release()
	a, took = h.until(6*timeout, healthy)
	got["released"] = []string{a}
	log("released", "%v after the lock was released", took)
	waitFor(t, time.Minute, name+" programs the Service added while the lock was held", func() error { return h.programmed(stale) })

	// The API server gone: a drop, sampled for three health timeouts and
	// until the proxy's log has said for a health timeout that its
	// connections failed (client-go's HTTP/2 health check gives a silent
	// connection up within 45 s; edgeproxy's heartbeat sooner).
	before := logSize(logPath)
	h.drop(t, "-I")
	cut := time.Now()
	var lost string
	var lostAfter time.Duration
	var ok bool
	got["apiserver-gone"], ok = h.seenUntil(3*timeout, timeout, 3*time.Minute, func() bool {
		lost, lostAfter = lostAPIServer(logPath, before), time.Since(cut).Round(100*time.Millisecond)
		return lost != ""
	})
	log("apiserver-gone", "sampled for %v; the log said so %v after the drop", time.Since(cut).Round(time.Second), lostAfter)
	if !ok {
		t.Fatalf("%s's log says nothing of the API server during the outage: the world did not cut it off", name)
	}
	t.Logf("%s log during the outage: %q", name, lost)
	h.drop(t, "-D")
	back = time.Now()
	added := h.service(t)
	waitFor(t, 3*time.Minute, name+" programs a Service added once the API server is back", func() error { return h.programmed(added) })
	a, took = h.until(time.Minute, healthy)
	got["apiserver-back"] = []string{a}
	log("apiserver-back", "a Service added then programmed %v after the API server came back, this answer %v later", time.Since(back).Round(100*time.Millisecond), took)

	if err := p.Exited(); err != nil {
		t.Fatal(err)
	}
	p.Stop()
	return got
}

func logSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// lostAPIServer is the first line of the log at path, after offset, that
// says a connection to the API server failed.
func lostAPIServer(path string, offset int64) string {
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) < offset {
		return ""
	}
	for _, line := range strings.Split(string(b[offset:]), "\n") {
		for _, sign := range []string{"client connection lost", "i/o timeout", "connection timed out", "does not answer", "unreachable"} {
			if strings.Contains(line, sign) {
				return line
			}
		}
	}
	return ""
}

// The answers a proxy gives when synced, and when stale.
const (
	answerHealthy   = "healthz 200 healthy=true nodeEligible=true; livez 200 healthy=true"
	answerUnhealthy = "healthz 503 healthy=false nodeEligible=true; livez 503 healthy=false"
	answerNone      = "healthz no answer; livez no answer"
)

// TestHealthAgainstKubeProxy puts kube-proxy (iptables mode) and
// edgeproxy, one after the other, through the same states and compares
// what their /healthz and /livez answer in each. kube-proxy's answers are
// anchored: a world that does not put it in a state fails the test. The
// one deliberate difference is listed in test/conformance/DIFFERENCES.md
// ("Health before the API server answers"): starting, edgeproxy answers
// 503 where kube-proxy has no port open yet.
func TestHealthAgainstKubeProxy(t *testing.T) {
	bin := rootAgent(t, "iptables-legacy", "iptables-legacy-restore", "iptables-legacy-save", "iptables-nft", "nft")
	kubeProxy := kubeProxyBinary(t)

	node := netns.NewNode(t, "node")
	a := node.AddPod("a")
	serve(t, a)
	w := newAPIWorld(t, node, "health", 15*time.Minute)
	w.readyPod(t, "a", a, map[string]string{"app": "web"}, podPorts(false))

	dir := t.TempDir()
	h := &healthWorld{node: node, w: w, lockFile: filepath.Join(dir, "xtables.lock")}
	t.Setenv("XTABLES_LOCKFILE", h.lockFile)
	var err error
	if h.path, err = proxies.BackendPath(dir, "legacy"); err != nil {
		t.Fatal(err)
	}
	h.settings = proxies.Settings{Backend: "legacy", MinSync: 200 * time.Millisecond, Sync: healthSyncPeriod, ClusterCIDR: "10.244.0.0/16"}
	h.pn = proxies.Node{Name: nodeName, Kubeconfig: w.kubeconfig(t, dir), MetricsAddr: "127.0.0.1:10249", HealthzAddr: "0.0.0.0:10256"}
	h.service(t) // 10.96.26.1, there from the start
	logOnFailure(t, node, "iptables-legacy-save")

	kpLog := filepath.Join(dir, "kube-proxy.log")
	kp := h.run(t, "kube-proxy", kpLog, func() *proxies.Process {
		return startProxy(t, node, "kube-proxy", kpLog, h.path, append([]string{kubeProxy}, proxies.KubeProxyArgs(h.pn, h.settings)...)...)
	}, func() error {
		// kube-proxy runs a proxier per family, each with its own health:
		// an IPv6 first sync still running when the lock is taken would
		// fail, and kube-proxy retries a failed first sync only on the
		// next IPv6 change (it is not run by its sync runner).
		body, err := nodeGET(node, h.pn.MetricsAddr, "/metrics")
		if err != nil {
			return err
		}
		for _, fam := range []string{"IPv4", "IPv6"} {
			if !proxies.Nonzero(body, proxies.MetricSyncTimestamp, fam) {
				return fmt.Errorf("kube-proxy has not finished an %s sync", fam)
			}
		}
		return nil
	})
	// kube-proxy's column: what its code says it answers in each state.
	anchors := map[string][]string{
		"starting": {answerNone}, "synced": {answerHealthy}, "stale": {answerUnhealthy},
		"released": {answerHealthy}, "apiserver-gone": {answerHealthy}, "apiserver-back": {answerHealthy},
	}
	for _, s := range healthStates {
		if !slices.Equal(kp[s], anchors[s]) {
			t.Errorf("kube-proxy %s: %q, want %q: the world did not put it in that state", s, kp[s], anchors[s])
		}
	}
	if t.Failed() {
		return
	}

	if err := proxies.Reset(node.Run); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "edgeproxy.yaml")
	conf := proxies.EdgeProxyConfig(h.pn, h.settings, filepath.Join(dir, "state"))
	conf = strings.Replace(conf, "sync:\n", fmt.Sprintf("sync:\n  healthTimeout: %s\n", 2*healthSyncPeriod), 1)
	writeFile(t, cfg, conf)
	epLog := filepath.Join(dir, "edgeproxy.log")
	ep := h.run(t, "edgeproxy", epLog, func() *proxies.Process {
		return startProxy(t, node, "edgeproxy", epLog, h.path, bin, "run", "--config", cfg)
	}, nil) // one sync programs both families

	for _, s := range healthStates {
		want := kp[s]
		got := ep[s]
		if s == "starting" {
			// The listed difference: 503 where kube-proxy has no port
			// open; before that, edgeproxy's process may not listen yet
			// either.
			want = []string{answerUnhealthy}
			for len(got) > 1 && strings.Contains(got[0], "no answer") {
				got = got[1:]
			}
		}
		mark := "same"
		if !slices.Equal(got, want) {
			mark = "DIFFERENT"
			t.Errorf("edgeproxy %s: %q, want %q (kube-proxy: %q)", s, ep[s], want, kp[s])
		} else if !slices.Equal(ep[s], kp[s]) {
			mark = "listed difference"
		}
		t.Logf("%-15s %s\n  kube-proxy: %s\n  edgeproxy:  %s", s, mark, strings.Join(kp[s], " then "), strings.Join(ep[s], " then "))
	}
}
