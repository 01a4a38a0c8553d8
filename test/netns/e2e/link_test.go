package e2e_test

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
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
	// The kernel gives the connection up after 15 s of silence, and the
	// /readyz asked a second later times out after 5 s: 21 s, 45 s with
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
	gate.Root(t)
	gate.Binaries(t, "iptables", "iptables-restore", "iptables-save")
	bin := agentBinary(t)

	node := netns.NewNode(t, "node")
	hostIP, nodeIP := node.LinkHost()
	cl := cluster.New(t, cluster.Options{BindAddress: hostIP.String(), Audit: true})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := cl.CreateNode(ctx, nodeName, "zone-a", nodeIP.String()); err != nil {
		t.Fatal(err)
	}
	ns := cl.Namespace(t)
	client := cl.Client()
	svc := func(name, ip string) {
		t.Helper()
		s := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.ServiceSpec{ClusterIP: ip, Selector: map[string]string{"app": name},
				Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(podPort)}}},
		}
		if _, err := client.CoreV1().Services(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod := func(name, app, ip string) {
		t.Helper()
		if _, err := cl.CreateReadyPod(ctx, ns, name, nodeName, ip, map[string]string{"app": app}, nil); err != nil {
			t.Fatal(err)
		}
	}
	ip := netip.MustParseAddr
	keep, changed, moved, gone, added := ip("10.244.7.1"), ip("10.244.7.2"), ip("10.244.7.22"), ip("10.244.7.3"), ip("10.244.7.4")
	svc("keep", "10.96.7.10")
	svc("change", "10.96.7.11")
	svc("gone", "10.96.7.12")
	pod("keep-1", "keep", keep.String())
	pod("change-1", "change", changed.String())
	pod("gone-1", "gone", gone.String())

	dir, cfg := apiAgentConfig(t, &apiWorld{c: cl, ctx: ctx, hostIP: hostIP, ns: ns}, "")
	started := time.Now()
	startAgent(t, node, bin, cfg, filepath.Join(dir, "agent.log"))
	rules := func(present, absent []netip.Addr) func() error {
		return func() error {
			have, err := natDestinations(node, podPort, append(present, absent...)...)
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
	waitFor(t, 60*time.Second, "the rules before the outage", rules([]netip.Addr{keep, changed, gone}, nil))
	// The first read of each is a LIST, which the API server gzips, not
	// a watch with initial events, which it does not (RATIONALE.md, "Why
	// a full read is a LIST").
	reads := func(since time.Time) map[string]int {
		t.Helper()
		evs, err := cl.AuditEvents("edgeproxy", since)
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
	if n := reads(started); n["list"] < 3 || n["watch-list"] != 0 {
		t.Errorf("reads at the start: %v, want a list of each (3 or 4) and no watch-list", n)
	}

	drop := func(op string) {
		t.Helper()
		for _, rule := range [][]string{{"INPUT", "-s", hostIP.String()}, {"OUTPUT", "-d", hostIP.String()}} {
			args := append([]string{op, rule[0]}, append(rule[1:], "-j", "DROP")...)
			if out, err := node.Run("iptables", args...); err != nil {
				t.Fatalf("iptables %v: %v: %s", args, err, out)
			}
		}
	}
	outage := time.Now()
	drop("-I")
	undrop := true
	defer func() {
		if undrop {
			drop("-D")
		}
	}()
	// The agent says so once its connections failed (the kernel gives
	// them up after 15 s of silence); its watches then ask again and find
	// the API server unreachable.
	waitFor(t, 45*time.Second, "the agent says the API server is unreachable", func() error {
		st, err := readAPIStatus(node)
		if err == nil && st.APIReachable {
			err = fmt.Errorf("still reachable")
		}
		return err
	})
	svc("added", "10.96.7.13")
	pod("added-1", "added", added.String())
	pod("change-2", "change", moved.String())
	if err := client.CoreV1().Pods(ns).Delete(ctx, "change-1", metav1.DeleteOptions{GracePeriodSeconds: ptrTo(int64(0))}); err != nil {
		t.Fatal(err)
	}
	if err := client.CoreV1().Services(ns).Delete(ctx, "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Longer than client-go's HTTP/2 health check (a ping after 30 s
	// without a frame, given up 15 s later), whose error would end the
	// watches with a relist.
	time.Sleep(time.Until(outage.Add(50 * time.Second)))
	drop("-D")
	undrop = false
	back := time.Now()
	waitFor(t, 90*time.Second, "the changes made during the outage in the rules",
		rules([]netip.Addr{keep, moved, added}, []netip.Addr{changed, gone}))
	t.Logf("outage %v; rules right %v after the link came back", back.Sub(outage).Round(time.Second), time.Since(back).Round(100*time.Millisecond))

	after := reads(outage)
	if after["list"] != 0 || after["watch-list"] != 0 || after["watch"] == 0 {
		t.Errorf("reads after the outage: %v, want watches only", after)
	}
	t.Logf("reads of the agent since the outage began: %v", after)
}

func ptrTo[T any](v T) *T { return &v }
