package e2e_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// holdServer is a pod's TCP server that says who it is and then echoes
// lines until the client closes, so a flow through a Service can stay
// established while the Service's endpoints change. kill closes only the
// listener (new connections are refused, as when the pod's process dies
// on a live pod); established connections go on.
type holdServer struct {
	pod   *netns.Pod
	port  uint16
	mu    sync.Mutex
	l     net.Listener
	conns []net.Conn
}

func serveHold(t *testing.T, p *netns.Pod, port uint16) *holdServer {
	h := &holdServer{pod: p, port: port}
	h.start(t)
	t.Cleanup(func() {
		h.kill()
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, c := range h.conns {
			c.Close()
		}
	})
	return h
}

func (h *holdServer) start(t *testing.T) {
	t.Helper()
	var l net.Listener
	if err := h.pod.Do(func() (err error) {
		l, err = net.Listen("tcp4", fmt.Sprintf(":%d", h.port))
		return err
	}); err != nil {
		t.Fatalf("listen in %s: %v", h.pod.PodName, err)
	}
	h.mu.Lock()
	h.l = l
	h.mu.Unlock()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			h.conns = append(h.conns, c)
			h.mu.Unlock()
			go func() {
				fmt.Fprintf(c, "%s %s\n", h.pod.PodName, c.RemoteAddr())
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
}

func (h *holdServer) kill() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.l != nil {
		h.l.Close()
		h.l = nil
	}
}

// probeStatus is the probes part of the agent's /debug/status.
type probeStatus struct {
	Probes *struct {
		Active  bool              `json:"active"`
		States  map[string]int    `json:"states"`
		LeftOut map[string]string `json:"leftOut"`
	} `json:"probes"`
}

// debugStatus reads the probes of /debug/status from the agent in the
// node.
func debugStatus(node *netns.Node) (probeStatus, error) {
	var st probeStatus
	if err := readStatus(node, &st); err != nil {
		return st, err
	}
	if st.Probes == nil {
		return st, fmt.Errorf("/debug/status has no probes section")
	}
	return st, nil
}

// readStatus decodes /debug/status from the agent in the node into v.
func readStatus(node *netns.Node, v any) error {
	body, err := nodeGET(node, "127.0.0.1:10249", "/debug/status")
	if err != nil {
		return err
	}
	return json.Unmarshal([]byte(body), v)
}

// spread makes n connections to dst and counts who answered; failed
// counts connections that were not answered.
func spread(client *netns.NS, dst netip.AddrPort, n int) (by map[string]int, failed int) {
	by = map[string]int{}
	for range n {
		r, err := client.TCP(dst, time.Second)
		if err != nil {
			failed++
			continue
		}
		by[r.Name]++
	}
	return by, failed
}

// natDestinations reports which of ips are DNAT destinations (ip:port) in
// the node's nat table.
func natDestinations(node *netns.Node, port uint16, ips ...netip.Addr) (map[netip.Addr]bool, error) {
	save, err := node.Run("iptables-save", "-t", "nat")
	if err != nil {
		return nil, err
	}
	out := map[netip.Addr]bool{}
	for _, ip := range ips {
		out[ip] = strings.Contains(save, fmt.Sprintf("--to-destination %s:%d", ip, port))
	}
	return out, nil
}

// While the API server is away, the agent probes the endpoints it serves:
// a pod whose server dies stops getting new connections (none of 200)
// while an established flow to another pod goes on; it gets traffic again
// once it listens; when every pod of the Service dies all stay programmed
// (no blackhole on the prober's judgement); a Service that opts out keeps
// its dead endpoint. When the API server returns its EndpointSlices win
// in the same sync. The same after a disconnected reboot (the agent
// starts from its snapshot with the API server down and the rules gone).
func TestIPTablesProbesWhileAPIServerAway(t *testing.T) {
	bin := rootAgent(t, "iptables", "iptables-restore", "iptables-save")

	node := netns.NewNode(t, "node")
	pods := []*netns.Pod{node.AddPod("a"), node.AddPod("b"), node.AddPod("c")}
	client := node.AddPod("cl")
	servers := make([]*holdServer, len(pods))
	for i, p := range pods {
		servers[i] = serveHold(t, p, podPort)
	}
	a, b, c := pods[0], pods[1], pods[2]
	w := newAPIWorld(t, node, "probe", 8*time.Minute)
	cl, ctx, ns := w.c, w.ctx, w.ns
	labels := map[string]string{"app": "web"}
	for _, p := range pods {
		w.readyPod(t, p.PodName, p, labels, podPorts(false))
	}
	web := netip.AddrPortFrom(netip.MustParseAddr("10.96.102.10"), 80)
	quiet := netip.AddrPortFrom(netip.MustParseAddr("10.96.102.11"), 80)
	w.createService(t, clusterIPService("web", web.Addr(), labels, servicePort("tcp", corev1.ProtocolTCP, 80, podPort)))
	quietSvc := clusterIPService("quiet", quiet.Addr(), labels, servicePort("tcp", corev1.ProtocolTCP, 80, podPort))
	quietSvc.Annotations = map[string]string{"edgeproxy.io/offline-probe": "false"}
	w.createService(t, quietSvc)

	dir, cfg := apiAgentConfig(t, w, `offline: {snapshotInterval: 0s}
health: {mode: offline, after: 2s, interval: 300ms, timeout: 300ms, failureThreshold: 2}
`)
	logPath := filepath.Join(dir, "agent.log")
	ag := startAgent(t, node, bin, cfg, logPath)
	waitFor(t, 90*time.Second, "every pod answers the Service", func() error {
		if by, _ := spread(client.NS, web, 30); len(by) != 3 {
			return fmt.Errorf("answered by %v", by)
		}
		return nil
	})
	waitFor(t, 30*time.Second, "snapshot written", func() error {
		_, err := os.Stat(filepath.Join(dir, "state", "snapshot.json"))
		return err
	})

	// An established flow through the Service to pod b.
	held := holdTo(t, client, web, "b")
	defer held.Close()

	if err := cl.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "probing active once the API server is away", func() error {
		st, err := debugStatus(node)
		if err == nil && !st.Probes.Active {
			err = fmt.Errorf("probes: %+v", *st.Probes)
		}
		return err
	})

	// Pod a's server dies: within failureThreshold × interval and a sync,
	// new connections avoid it.
	servers[0].kill()
	died := time.Now()
	aEP := a.AddrPort(podPort).String()
	waitFor(t, 30*time.Second, "pod a left out", func() error {
		st, err := debugStatus(node)
		if err == nil && !strings.HasPrefix(st.Probes.LeftOut[aEP], "probe: ") {
			err = fmt.Errorf("left out: %v", st.Probes.LeftOut)
		}
		return err
	})
	t.Logf("pod a left out %s after its server died", time.Since(died).Round(10*time.Millisecond))
	by, failed := spread(client.NS, web, 200)
	t.Logf("200 connections with pod a dead: %v, %d failed", by, failed)
	if by["a"] != 0 || failed != 0 || by["b"] == 0 || by["c"] == 0 {
		t.Errorf("200 connections with pod a dead: answered by %v, %d failed; want b and c only, none failed", by, failed)
	}
	if err := echo(held, "still there"); err != nil {
		t.Errorf("the established flow to pod b: %v", err)
	}
	// The Service that opted out still sends connections to pod a.
	if _, qf := spread(client.NS, quiet, 60); qf == 0 {
		t.Errorf("offline-probe false: none of 60 connections failed; pod a should still be programmed")
	}

	// Pod a listens again: it gets traffic again.
	servers[0].start(t)
	waitFor(t, 30*time.Second, "pod a answers again", func() error {
		if by, _ := spread(client.NS, web, 30); by["a"] == 0 {
			return fmt.Errorf("answered by %v", by)
		}
		return nil
	})

	// Every pod dies: all stay programmed rather than none.
	for _, s := range servers {
		s.kill()
	}
	waitFor(t, 30*time.Second, "all three probed as failed", func() error {
		st, err := debugStatus(node)
		if err == nil && st.Probes.States["failed"] != 3 {
			err = fmt.Errorf("states %v", st.Probes.States)
		}
		return err
	})
	waitFor(t, 30*time.Second, "with every pod dead, none left out", func() error {
		st, err := debugStatus(node)
		if err == nil && len(st.Probes.LeftOut) != 0 {
			err = fmt.Errorf("left out: %v", st.Probes.LeftOut)
		}
		return err
	})
	if dests, err := natDestinations(node, podPort, a.IP, b.IP, c.IP); err != nil {
		t.Fatal(err)
	} else if !dests[a.IP] || !dests[b.IP] || !dests[c.IP] {
		t.Errorf("with every pod dead, DNAT destinations %v; want all three kept", dests)
	}
	for _, s := range servers[1:] {
		s.start(t)
	}

	// The API server returns with pod a still dead (left out) and then a
	// different set: its EndpointSlices are the truth again. Pod a is back
	// in the rules at once (verdicts dropped), pod c leaves with its slice.
	waitFor(t, 30*time.Second, "pod a left out again", func() error {
		st, err := debugStatus(node)
		if err == nil && st.Probes.LeftOut[aEP] == "" {
			err = fmt.Errorf("left out: %v", st.Probes.LeftOut)
		}
		return err
	})
	if err := cl.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cl.SetPodReady(ctx, ns, "c", false); err != nil {
		t.Fatal(err)
	}
	// The controller manager's part first, on its own bound.
	back := time.Now()
	if err := cl.WaitSliceReady(ctx, ns, "web", c.IP.String(), false, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("the controller manager updated the slice %s after the API server returned", time.Since(back).Round(10*time.Millisecond))
	waitFor(t, 90*time.Second, "the slices win: a and b programmed, c gone, probing off", func() error {
		dests, err := natDestinations(node, podPort, a.IP, b.IP, c.IP)
		if err != nil {
			return err
		}
		if !dests[a.IP] || !dests[b.IP] || dests[c.IP] {
			return fmt.Errorf("DNAT destinations %v", dests)
		}
		st, err := debugStatus(node)
		if err == nil && (st.Probes.Active || len(st.Probes.LeftOut) != 0) {
			err = fmt.Errorf("probes %+v", *st.Probes)
		}
		return err
	})
	servers[0].start(t)
	waitFor(t, 30*time.Second, "snapshot has a and b only", func() error {
		raw, err := os.ReadFile(filepath.Join(dir, "state", "snapshot.json"))
		if err == nil && (!strings.Contains(string(raw), a.IP.String()) || strings.Contains(string(raw), `"`+c.IP.String()+`:`)) {
			err = fmt.Errorf("snapshot not yet a and b only")
		}
		return err
	})

	// A disconnected reboot: SIGKILL, API server down, rules flushed, and
	// pod b's server dead. The agent starts from its snapshot, probes at
	// once and leaves b out.
	ag.kill(t)
	if err := cl.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	flushRules(t, node, bin, cfg)
	servers[1].kill()
	started := time.Now()
	startAgent(t, node, bin, cfg, logPath)
	bEP := b.AddrPort(podPort).String()
	waitFor(t, 30*time.Second, "after the reboot, pod b left out", func() error {
		st, err := debugStatus(node)
		if err == nil && !strings.HasPrefix(st.Probes.LeftOut[bEP], "probe: ") {
			err = fmt.Errorf("probes %+v", *st.Probes)
		}
		return err
	})
	t.Logf("disconnected reboot: pod b left out %s after the agent started", time.Since(started).Round(10*time.Millisecond))
	by, failed = spread(client.NS, web, 200)
	t.Logf("after the reboot, 200 connections with pod b dead: %v, %d failed", by, failed)
	if by["a"] != 200 || failed != 0 {
		t.Errorf("after the reboot, 200 connections with pod b dead: answered by %v, %d failed; want all by a", by, failed)
	}
}

// holdTo opens connections to dst from client until one is answered by
// pod want (at most 100 tries) and returns it open.
func holdTo(t *testing.T, client *netns.Pod, dst netip.AddrPort, want string) net.Conn {
	t.Helper()
	for range 100 {
		var conn net.Conn
		if err := client.Do(func() (err error) {
			conn, err = net.DialTimeout("tcp", dst.String(), time.Second)
			return err
		}); err != nil {
			continue
		}
		_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err == nil && strings.HasPrefix(line, want+" ") {
			return conn
		}
		conn.Close()
	}
	t.Fatalf("no connection to %s answered by %s in 100 tries", dst, want)
	return nil
}

// echo sends line on an established connection and reads it back.
func echo(c net.Conn, line string) error {
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintf(c, "%s\n", line); err != nil {
		return err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if got != line+"\n" {
		return fmt.Errorf("echoed %q, want %q", got, line)
	}
	return nil
}
