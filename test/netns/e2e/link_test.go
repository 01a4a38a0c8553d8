package e2e_test

import (
	"context"
	"fmt"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/test/cluster"
)

// apiStatus is the API part of the agent's /debug/status.
type apiStatus struct {
	APIReachable bool `json:"apiReachable"`
	Health       struct {
		APIServerLastContact time.Time `json:"apiserverLastContact"`
	} `json:"health"`
	Link struct {
		BytesIn int64 `json:"bytesIn"`
		Lists   int   `json:"lists"`
		Watches int   `json:"watches"`
	} `json:"link"`
}

func readAPIStatus(node *netns.Node) (apiStatus, error) {
	var st apiStatus
	return st, readStatus(node, &st)
}

// The link to the API server goes silent: every packet between the node
// and the API server is dropped, nothing is reset, as when an edge site's
// uplink fails. The agent asks nothing of a healthy quiet API server, so
// it is its connection's TCP keepalive that must notice: within a bound
// the agent says the API server is unreachable (and keeps its rules), and
// once the link is back it says so again. Before the drop, a quiet while
// keeps the last contact fresh (the API server's kernel answers the
// probes).
func TestAPILinkGoesSilent(t *testing.T) {
	bin := rootAgent(t, "iptables", "iptables-restore", "iptables-save")

	node := netns.NewNode(t, "node")
	w := newAPIWorld(t, node, "", 5*time.Minute)
	hostIP := w.hostIP
	dir, cfg := apiAgentConfig(t, w, "")
	startAgent(t, node, bin, cfg, filepath.Join(dir, "agent.log"))
	waitFor(t, 60*time.Second, "the agent hears the API server", func() error {
		st, err := readAPIStatus(node)
		if err == nil && (!st.APIReachable || st.Health.APIServerLastContact.IsZero()) {
			err = fmt.Errorf("%+v", st)
		}
		return err
	})

	time.Sleep(25 * time.Second) // quiet: no event, no heartbeat
	st, err := readAPIStatus(node)
	if err != nil {
		t.Fatal(err)
	}
	if age := time.Since(st.Health.APIServerLastContact); !st.APIReachable || age > 20*time.Second {
		t.Fatalf("after 25s of quiet: reachable %v, last contact %v ago; want reachable and heard within the keepalive interval", st.APIReachable, age.Round(time.Second))
	}

	drop := func(op string) {
		t.Helper()
		for _, rule := range [][]string{{"INPUT", "-s", hostIP.String()}, {"OUTPUT", "-d", hostIP.String()}} {
			args := append([]string{op, rule[0]}, append(rule[1:], "-p", "tcp", "-j", "DROP")...)
			if out, err := node.Run("iptables", args...); err != nil {
				t.Fatalf("iptables %v: %v: %s", args, err, out)
			}
		}
	}
	// The kernel gives the connection up after 20 s of silence (keepalive
	// idle 15 s, then a probe 5 s later; agent/source/link.go), and the
	// /readyz asked a second later times out after 5 s: 26 s, 45 s with
	// room for a loaded machine. Without keepalive only client-go's HTTP/2 health
	// check would notice (a PING after 30 s without a frame, given up 15 s
	// later), and the readyz after it would end past 50 s.
	drop("-I")
	silent := time.Now()
	waitFor(t, 45*time.Second, "the agent says the API server is unreachable", func() error {
		st, err := readAPIStatus(node)
		if err == nil && st.APIReachable {
			err = fmt.Errorf("still reachable, last contact %v ago", time.Since(st.Health.APIServerLastContact).Round(time.Second))
		}
		return err
	})
	t.Logf("unreachable %v after the link went silent", time.Since(silent).Round(100*time.Millisecond))

	drop("-D")
	back := time.Now()
	waitFor(t, 60*time.Second, "the agent hears the API server again", func() error {
		st, err := readAPIStatus(node)
		if err == nil && !st.APIReachable {
			err = fmt.Errorf("unreachable")
		}
		return err
	})
	t.Logf("reachable %v after the link came back", time.Since(back).Round(100*time.Millisecond))
}

// outageWorld is an agent in a node namespace whose one way to the API
// server (with an audit log of reads) is the node's veth, with three
// Services and their endpoints programmed: the start of the outage tests.
type outageWorld struct {
	node    *netns.Node
	cl      *cluster.Cluster
	ctx     context.Context
	ns      string
	hostIP  netip.Addr
	started time.Time // the agent's start
	// The agent, and what restarts it.
	ag                *agent
	bin, cfg, logPath string
	stateDir          string
}

// The endpoints of the outage tests' Services: keep's stays; change's
// moves to moved during the outage; gone's Service is deleted then; added
// is added then.
var (
	outKeep, outChanged, outMoved = netip.MustParseAddr("10.244.7.1"), netip.MustParseAddr("10.244.7.2"), netip.MustParseAddr("10.244.7.22")
	outGone, outAdded             = netip.MustParseAddr("10.244.7.3"), netip.MustParseAddr("10.244.7.4")
)

func newOutageWorld(t *testing.T) *outageWorld {
	t.Helper()
	return newOutageWorldWith(t, "")
}

// newOutageWorldWith is newOutageWorld with extra lines of agent config.
func newOutageWorldWith(t *testing.T, extra string) *outageWorld {
	t.Helper()
	gate.Root(t)
	gate.Binaries(t, "iptables", "iptables-restore", "iptables-save")
	bin := agentBinary(t)

	node := netns.NewNode(t, "node")
	hostIP, nodeIP := node.LinkHost()
	cl := cluster.New(t, cluster.Options{BindAddress: hostIP.String(), Audit: true})
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	t.Cleanup(cancel)
	if _, err := cl.CreateNode(ctx, nodeName, "zone-a", nodeIP.String()); err != nil {
		t.Fatal(err)
	}
	w := &outageWorld{node: node, cl: cl, ctx: ctx, ns: cl.Namespace(t), hostIP: hostIP}
	w.service(t, "keep", "10.96.7.10")
	w.service(t, "change", "10.96.7.11")
	w.service(t, "gone", "10.96.7.12")
	w.pod(t, "keep-1", "keep", outKeep)
	w.pod(t, "change-1", "change", outChanged)
	w.pod(t, "gone-1", "gone", outGone)

	dir, cfg := apiAgentConfig(t, &apiWorld{c: cl, ctx: ctx, hostIP: hostIP, ns: w.ns}, extra)
	w.started = time.Now()
	w.bin, w.cfg, w.logPath, w.stateDir = bin, cfg, filepath.Join(dir, "agent.log"), filepath.Join(dir, "state")
	w.ag = startAgent(t, node, bin, cfg, w.logPath)
	waitFor(t, 60*time.Second, "the rules before the outage", w.rules([]netip.Addr{outKeep, outChanged, outGone}, nil))
	// The first read of each is a LIST, which the API server gzips, not
	// a watch with initial events, which it does not (RATIONALE.md, "Why
	// a full read is a LIST").
	if n := w.reads(t, w.started); n["list"] < 3 || n["watch-list"] != 0 {
		t.Errorf("reads at the start: %v, want a list of each (3; 4 with a proxyName) and no watch-list", n)
	}
	return w
}

func (w *outageWorld) service(t *testing.T, name, ip string) {
	t.Helper()
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name},
		Spec: corev1.ServiceSpec{ClusterIP: ip, Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(podPort)}}},
	}
	if _, err := w.cl.Client().CoreV1().Services(w.ns).Create(w.ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (w *outageWorld) pod(t *testing.T, name, app string, ip netip.Addr) {
	t.Helper()
	if _, err := w.cl.CreateReadyPod(w.ctx, w.ns, name, nodeName, ip.String(), map[string]string{"app": app}, nil); err != nil {
		t.Fatal(err)
	}
}

// rules checks that every address in present is a DNAT destination and
// none in absent is.
func (w *outageWorld) rules(present, absent []netip.Addr) func() error {
	return func() error {
		have, err := natDestinations(w.node, podPort, append(present, absent...)...)
		if err != nil {
			return err
		}
		for _, a := range present {
			if !have[a] {
				return fmt.Errorf("%s is not a DNAT destination", a)
			}
		}
		for _, a := range absent {
			if have[a] {
				return fmt.Errorf("%s is still a DNAT destination", a)
			}
		}
		return nil
	}
}

// reads counts the agent's reads of its resources since since, from the
// audit log: by kind ("list", "watch-list", "watch"), and the full reads
// also by kind and request URI.
func (w *outageWorld) reads(t *testing.T, since time.Time) map[string]int {
	t.Helper()
	evs, err := w.cl.AuditEvents("edgeproxy", since)
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, e := range evs {
		switch e.Resource() {
		case "services", "endpointslices", "nodes":
			if r := e.Read(); r != "" {
				n[r]++
				if r != "watch" {
					n[r+" "+e.RequestURI]++
				}
			}
		}
	}
	return n
}

// drop inserts (-I) or deletes (-D) the blackhole: every packet between
// the node and the API server dropped in the node, nothing reset.
func (w *outageWorld) drop(t *testing.T, op string) {
	t.Helper()
	for _, rule := range [][]string{{"INPUT", "-s", w.hostIP.String()}, {"OUTPUT", "-d", w.hostIP.String()}} {
		args := append([]string{op, rule[0]}, append(rule[1:], "-j", "DROP")...)
		if out, err := w.node.Run("iptables", args...); err != nil {
			t.Fatalf("iptables %v: %v: %s", args, err, out)
		}
	}
}

// blackhole starts the outage (cut) and waits until the agent says the
// API server is unreachable.
func (w *outageWorld) blackhole(t *testing.T) (end func()) {
	t.Helper()
	end = w.cut(t)
	w.unreachable(t)
	return end
}

// cut starts the outage. The returned function ends it; it is also run
// at cleanup if the test did not.
func (w *outageWorld) cut(t *testing.T) (end func()) {
	t.Helper()
	w.drop(t, "-I")
	ended := false
	end = func() {
		if !ended {
			ended = true
			w.drop(t, "-D")
		}
	}
	t.Cleanup(end)
	return end
}

// unreachable waits until the agent says the API server is unreachable
// (the kernel gives its connections up after 20 s of silence; its watches
// then ask again and find no one).
func (w *outageWorld) unreachable(t *testing.T) {
	t.Helper()
	waitFor(t, 45*time.Second, "the agent says the API server is unreachable", func() error {
		st, err := readAPIStatus(w.node)
		if err == nil && st.APIReachable {
			err = fmt.Errorf("still reachable")
		}
		return err
	})
}

// changeAll adds a Service, moves one's endpoint and deletes one: what the
// agent must find after the outage.
func (w *outageWorld) changeAll(t *testing.T) {
	t.Helper()
	client := w.cl.Client()
	w.service(t, "added", "10.96.7.13")
	w.pod(t, "added-1", "added", outAdded)
	w.pod(t, "change-2", "change", outMoved)
	if err := client.CoreV1().Pods(w.ns).Delete(w.ctx, "change-1", metav1.DeleteOptions{GracePeriodSeconds: ptrTo(int64(0))}); err != nil {
		t.Fatal(err)
	}
	if err := client.CoreV1().Services(w.ns).Delete(w.ctx, "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// changed waits for changeAll's changes in the rules.
func (w *outageWorld) changed(t *testing.T, within time.Duration) {
	t.Helper()
	waitFor(t, within, "the changes made during the outage in the rules",
		w.rules([]netip.Addr{outKeep, outMoved, outAdded}, []netip.Addr{outChanged, outGone}))
}

// A short outage costs a resumed watch, not a relist: the link goes
// silent (a drop rule, not a closed port) long enough for the agent's
// connections to fail and its watch requests to find the API server
// unreachable; meanwhile a Service is added, one changes endpoint and one
// is deleted. When the link is back, the agent asks for no list and no
// watch with initial events (the API server's audit log), only watches
// from the resourceVersions it had, and the rules hold all three changes,
// as after a relist. See RATIONALE.md, "Why a short outage costs a
// resumed watch, not a relist".
func TestAPIOutageResumesWatches(t *testing.T) {
	w := newOutageWorld(t)
	outage := time.Now()
	end := w.blackhole(t)
	w.changeAll(t)
	// Longer than client-go's HTTP/2 health check (a ping after 30 s
	// without a frame, given up 15 s later), whose error would end the
	// watches with a relist.
	time.Sleep(time.Until(outage.Add(50 * time.Second)))
	end()
	back := time.Now()
	w.changed(t, 90*time.Second)
	t.Logf("outage %v; rules right %v after the link came back", back.Sub(outage).Round(time.Second), time.Since(back).Round(100*time.Millisecond))

	after := w.reads(t, outage)
	if after["list"] != 0 || after["watch-list"] != 0 || after["watch"] == 0 {
		t.Errorf("reads after the outage: %v, want watches only", after)
	}
	t.Logf("reads of the agent since the outage began: %v", after)
	w.statusReads(t)
}

// statusReads checks that the agent's status counts the full lists the
// API server's audit log has of it since its start, and logs the bytes.
func (w *outageWorld) statusReads(t *testing.T) {
	t.Helper()
	st, err := readAPIStatus(w.node)
	if err != nil {
		t.Fatal(err)
	}
	lists := w.reads(t, w.started)["list"]
	if st.Link.Lists != lists || st.Link.Watches == 0 || st.Link.BytesIn == 0 {
		t.Errorf("status link %+v; want the %d lists of the audit log, watches and bytes", st.Link, lists)
	}
	t.Logf("status link: %+v", st.Link)
}

func ptrTo[T any](v T) *T { return &v }

// Beyond the watch cache's window the API server no longer has the
// agent's resourceVersions, and the agent reads each resource again once,
// with a LIST (which the API server gzips when it is large), as the
// reflector does on 410 Gone: issue 28's G5, at most one full read per
// resource per outage beyond the window (three with the default config). The API server's watch cache keeps at least
// 75 s of events and evicts the oldest only when full (capacity 100,
// doubled while every event in it is younger than 75 s): so the outage
// lasts 80 s, then other objects of the three resources (a headless
// Service, a headless slice, another Node: nothing the agent is sent)
// change (cluster.Churn) until a watch from a resourceVersion read after
// the drop answers 410 Gone for each. When the link is back, the agent's reads
// are one LIST per informer, the same ones as at its start, then watches;
// the rules hold the changes made during the outage.
func TestAPIOutageBeyondWatchCache(t *testing.T) {
	w := newOutageWorld(t)
	atStart := listsOnce(w.reads(t, w.started))
	outage := time.Now()
	end := w.cut(t)
	// The agent hears nothing after the drop: no resourceVersion it holds
	// is newer than rv.
	rvRead := time.Now()
	rv, err := w.cl.Watermark(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	w.unreachable(t)
	w.changeAll(t)

	w.churnPastWatchCache(t, rv, rvRead, outage)
	w.relistedOnce(t, end, outage, atStart)
}

// churnPastWatchCache waits until every event up to rv (read at rvRead) is
// older than the watch caches' 75 s, so that the churn evicts them instead
// of growing the caches, then changes other objects until a watch from rv
// is answered 410 Gone for each resource.
func (w *outageWorld) churnPastWatchCache(t *testing.T, rv string, rvRead, outage time.Time) {
	t.Helper()
	time.Sleep(time.Until(rvRead.Add(80 * time.Second)))
	churn, err := w.cl.NewChurn(w.ctx, w.ns, "churn")
	if err != nil {
		t.Fatal(err)
	}
	changes, err := churn.UntilGone(w.ctx, rv, 100, 10)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("watches from %s answered 410 Gone after %d changes of each resource, %v into the outage", rv, changes, time.Since(outage).Round(time.Second))
}

// relistedOnce ends the outage (end) that began at outage and checks what
// follows: the rules hold the changes made during it, and the agent reads
// each resource again once, with a LIST per informer, the same ones as at
// its start (atStart), then watches.
func (w *outageWorld) relistedOnce(t *testing.T, end func(), outage time.Time, atStart map[string]int) {
	t.Helper()
	end()
	back := time.Now()
	// The reflectors' retries wait up to 60 s (client-go's backoff: 30 s,
	// jittered up to twice that) before a watch finds the link back, and
	// as long again before the LIST that follows its 410.
	w.changed(t, 150*time.Second)
	t.Logf("outage %v; rules right %v after the link came back", back.Sub(outage).Round(time.Second), time.Since(back).Round(100*time.Millisecond))

	// Each informer's reflector lists when its own retry comes: the
	// rules need only the Services and the slices.
	waitFor(t, 150*time.Second, "a LIST of each informer", func() error {
		if lists := listsOnce(w.reads(t, back)); len(lists) < len(atStart) {
			return fmt.Errorf("%d informers of %d listed: %v", len(lists), len(atStart), lists)
		}
		return nil
	})
	after := w.reads(t, back)
	lists := listsOnce(after)
	if after["watch-list"] != 0 || after["watch"] == 0 || len(lists) != len(atStart) {
		t.Errorf("reads after the outage: %v, want one LIST per informer (%d), then watches", after, len(atStart))
	}
	for q, n := range lists {
		if n != 1 || atStart[q] != 1 {
			t.Errorf("after the outage %d LISTs of %s (%d at the start), want 1", n, q, atStart[q])
		}
	}
	t.Logf("reads of the agent since the link came back: %v", after)
	w.statusReads(t)
}

// listsOnce counts reads' LISTs by what they ask for, without the
// resourceVersion (and its match) and limit they ask it at.
func listsOnce(reads map[string]int) map[string]int {
	out := map[string]int{}
	for k, n := range reads {
		uri, ok := strings.CutPrefix(k, "list ")
		if !ok {
			continue
		}
		u, err := url.Parse(uri)
		if err != nil {
			out[uri] += n
			continue
		}
		q := u.Query()
		q.Del("resourceVersion")
		q.Del("resourceVersionMatch")
		q.Del("limit")
		u.RawQuery = q.Encode()
		out[u.String()] += n
	}
	return out
}
