package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// A node reboots while its uplink is down. The agent (mode iptables, in the
// node namespace, against the real API server) dies by SIGKILL, the
// cluster changes (a second pod), the API server goes away, and the node's
// rules are flushed as a reboot would. Started again, the agent programs
// the last known state from its snapshot and the service answers from the
// old pod within seconds; when the API server returns it converges to the
// second pod without a moment in which the service stops answering.
func TestIPTablesOfflineRestart(t *testing.T) {
	bin := rootAgent(t, "iptables", "iptables-restore", "iptables-save")

	node := netns.NewNode(t, "node")
	a, b, client := node.AddPod("a"), node.AddPod("b"), node.AddPod("c")
	serve(t, a, b)
	w := newAPIWorld(t, node, "offline", 5*time.Minute)
	c, ctx, ns := w.c, w.ctx, w.ns
	ports := podPorts(false)
	labels := map[string]string{"app": "web"}
	w.readyPod(t, "a", a, labels, ports)
	vip := netip.MustParseAddr("10.96.101.10")
	w.createService(t, clusterIPService("web", vip, labels, servicePort("tcp", corev1.ProtocolTCP, 80, podPort)))

	dir, cfg := apiAgentConfig(t, w, "offline: {snapshotInterval: 0s}\n")
	stateDir := filepath.Join(dir, "state")
	logPath := filepath.Join(dir, "agent.log")
	logOnFailure(t, node, "iptables-save")
	firstStart := time.Now()
	ag := startAgent(t, node, bin, cfg, logPath)

	dst := netip.AddrPortFrom(vip, 80)
	answeredBy := func(want string) func() error {
		return func() error {
			r, err := client.TCP(dst, time.Second)
			if err == nil && r.Name != want {
				err = fmt.Errorf("answered by %q, want %q", r.Name, want)
			}
			return err
		}
	}
	for deadline := firstStart.Add(90 * time.Second); answeredBy("a")() != nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("ClusterIP not answered by a within 90s: %v", answeredBy("a")())
		}
	}
	t.Logf("first start with the API server up: first answered connection %s after the agent started", time.Since(firstStart).Round(10*time.Millisecond))
	// snapshotHolds: the snapshot on disk names the pod's address.
	snapshotHolds := func(p *netns.Pod) func() error {
		return func() error {
			raw, err := os.ReadFile(filepath.Join(stateDir, "snapshot.json"))
			if err != nil {
				return err
			}
			if !strings.Contains(string(raw), p.IP.String()) {
				return fmt.Errorf("snapshot lacks pod %s", p.PodName)
			}
			return nil
		}
	}
	waitFor(t, 30*time.Second, "snapshot written", snapshotHolds(a))

	// The node dies (SIGKILL: no clean shutdown). The cluster changes
	// while it is down: pod b becomes ready behind the service. Then the
	// uplink is gone too (the API server stops).
	ag.kill(t)
	w.readyPod(t, "b", b, labels, ports)
	waitFor(t, 30*time.Second, "EndpointSlice lists pod b", func() error {
		return sliceHas(ctx, c.Client(), ns, "web", b.IP.String())
	})
	if err := c.StopAPIServer(); err != nil {
		t.Fatal(err)
	}

	// The reboot: every rule the agent made is gone, and the service with
	// it.
	flushRules(t, node, bin, cfg)
	if save, err := node.Run("iptables-save"); err != nil {
		t.Fatal(err)
	} else if strings.Contains(save, vip.String()) {
		t.Fatalf("rules for %s survived the flush:\n%s", vip, save)
	}
	if r, err := client.TCP(dst, time.Second); err == nil {
		t.Fatalf("ClusterIP answered (%+v) with the rules flushed", r)
	}

	// Started without its API server and with the default offline start
	// timeout (10s): the kernel holds none of its rules, so the agent
	// programs the last known state at once instead of waiting for the API
	// server. The time to the first answered connection is logged (a
	// measurement, not an assertion); only pod a is in the snapshot.
	started := time.Now()
	ag = startAgent(t, node, bin, cfg, logPath)
	for deadline := started.Add(30 * time.Second); answeredBy("a")() != nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("ClusterIP not answered by a from the snapshot within 30s: %v", answeredBy("a")())
		}
	}
	t.Logf("disconnected reboot: first answered connection %s after the agent started", time.Since(started).Round(10*time.Millisecond))
	for i := range 20 {
		if err := answeredBy("a")(); err != nil {
			t.Fatalf("connection %d from the snapshot: %v", i, err)
		}
	}
	if out, _ := os.ReadFile(logPath); !strings.Contains(string(out), "the kernel holds none of our rules (a reboot); programming the last known state") {
		t.Errorf("the agent log does not say it serves the snapshot at once after the reboot")
	}

	// The API server returns: the agent converges to pod b. A client
	// probes from before the return until b has answered a few times;
	// every connection must be answered (no moment without rules).
	type probe struct {
		served map[string]int
		err    error
	}
	probed := make(chan probe, 1)
	go func() { // ends after b answered 5 times, a failure, or 120 s
		p := probe{served: map[string]int{}}
		defer func() { probed <- p }()
		for deadline := time.Now().Add(120 * time.Second); p.served["b"] < 5; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				p.err = errors.New("pod b never answered within 120s")
				return
			}
			r, err := client.TCP(dst, 2*time.Second)
			if err != nil {
				p.err = fmt.Errorf("connection failed while converging: %w", err)
				return
			}
			p.served[r.Name]++
		}
	}()
	time.Sleep(500 * time.Millisecond) // some probes before the return
	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	p := <-probed
	if p.err != nil {
		t.Fatalf("answers %v: %v", p.served, p.err)
	}
	t.Logf("answers while converging: %v", p.served)
	// The reconcile is logged once the informers report synced, which can
	// trail the first events by a poll interval.
	waitFor(t, 10*time.Second, "the agent logs that it converged after the API server returned", func() error {
		if out, _ := os.ReadFile(logPath); !strings.Contains(string(out), "the API server is back; converging from the snapshot") {
			return fmt.Errorf("not logged yet")
		}
		return nil
	})
	if err := healthz(node); err != nil {
		t.Errorf("agent after converging: %v", err)
	}

	// The snapshot is written beside the sync loop: a write still running
	// when b's sync landed leaves it dirty until the next sync, at most
	// sync.period (30 s) later. Killed before that, the agent would leave
	// a snapshot without b (2 of 13 runs did before this wait).
	waitFor(t, 60*time.Second, "snapshot written after converging", snapshotHolds(b))

	// Another reboot while offline, this time with a corrupt snapshot: it
	// is refused whole, with a log line, and nothing of it is programmed.
	ag.kill(t)
	if err := c.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	flushRules(t, node, bin, cfg)
	snap := filepath.Join(stateDir, "snapshot.json")
	raw, err := os.ReadFile(snap)
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(raw), b.IP.String()) // flip a bit inside pod b's address
	if i < 0 {
		t.Fatalf("the snapshot after converging lacks pod b")
	}
	raw[i] ^= 0x01
	if err := os.WriteFile(snap, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(logPath)
	ag = startAgent(t, node, bin, cfg, logPath)
	waitFor(t, 30*time.Second, "corrupt snapshot refused in the log", func() error {
		out, _ := os.ReadFile(logPath)
		if !strings.Contains(string(out[len(before):]), "snapshot is refused") {
			return errors.New("no refusal logged yet")
		}
		return nil
	})
	time.Sleep(time.Second) // a sync that wrongly followed the refusal would land by now
	if save, err := node.Run("iptables-save"); err != nil {
		t.Fatal(err)
	} else if strings.Contains(save, vip.String()) {
		t.Errorf("rules for %s programmed from a corrupt snapshot:\n%s", vip, save)
	}
	if r, err := client.TCP(dst, time.Second); err == nil {
		t.Errorf("ClusterIP answered (%+v) from a corrupt snapshot", r)
	}
}

// sliceHas reports nil when an EndpointSlice of service svc lists ip.
func sliceHas(ctx context.Context, client kubernetes.Interface, ns, svc, ip string) error {
	list, err := client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
	if err != nil {
		return err
	}
	for _, s := range list.Items {
		for _, e := range s.Endpoints {
			for _, a := range e.Addresses {
				if a == ip {
					return nil
				}
			}
		}
	}
	return fmt.Errorf("no EndpointSlice of %s/%s lists %s", ns, svc, ip)
}

// runIn runs the agent binary with args inside the node namespace and
// waits for it (bounded: cleanup has nothing to wait for).
func runIn(node *netns.Node, bin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out []byte
	err := node.Do(func() error {
		var err error
		out, err = exec.CommandContext(ctx, bin, args...).CombinedOutput()
		return err
	})
	return string(out), err
}

// A change that comes within offline.snapshotInterval of the last snapshot
// write is written later even when nothing else changes. In iptables mode a
// quiet node's syncs are idle (the kernel fingerprint vouches for the
// rules): they must still write what the interval put off, or a reboot
// without the API server would bring back rules older than the last change.
func TestIPTablesSnapshotPutOffIsWrittenWhenQuiet(t *testing.T) {
	bin := rootAgent(t, "iptables", "iptables-restore", "iptables-save")
	node := netns.NewNode(t, "node")
	w := newAPIWorld(t, node, "snapq", 3*time.Minute)
	dir, cfg := apiAgentConfig(t, w, "sync: {minPeriod: 200ms, period: 1s}\noffline: {snapshotInterval: 5s}\n")
	startAgent(t, node, bin, cfg, filepath.Join(dir, "agent.log"))
	snap := filepath.Join(dir, "state", "snapshot.json")
	holds := func(ip string) func() error {
		return func() error {
			raw, err := os.ReadFile(snap)
			if err != nil {
				return err
			}
			if !strings.Contains(string(raw), ip) {
				return fmt.Errorf("snapshot lacks %s", ip)
			}
			return nil
		}
	}
	create := func(name, ip string) {
		t.Helper()
		w.createService(t, clusterIPService(name, netip.MustParseAddr(ip), nil, servicePort("tcp", corev1.ProtocolTCP, 80, podPort)))
	}
	// The first service lands in a snapshot (written by its sync, or put
	// off after the first sync's write and written by a quiet one).
	create("first", "10.96.102.10")
	waitFor(t, 30*time.Second, "first in the snapshot", holds("10.96.102.10"))
	// Within the interval of that write: programmed now, written later,
	// with no change after it.
	create("second", "10.96.102.11")
	waitFor(t, 30*time.Second, "second in the rules", func() error {
		out, err := node.Run("iptables-save")
		if err == nil && !strings.Contains(out, "10.96.102.11") {
			err = errors.New("no rule for 10.96.102.11")
		}
		return err
	})
	waitFor(t, 30*time.Second, "second in the snapshot", holds("10.96.102.11"))
}
