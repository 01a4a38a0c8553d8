package e2e_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/test/bench"
	"github.com/edgeproxy/edgeproxy/test/cluster"
)

// 5,000 Services × 10 endpoints converge over a 64 kbit/s link: the
// agent's full reads come in pages, each a request the API server
// finishes writing within its 60 s request timeout. Read whole, the
// gzipped EndpointSlices (about 0.75 MB, some 95 s on this link) were
// reset by the API server at 60 s and asked again forever (RATIONALE.md,
// "Why a full read comes in pages"). The audit log must show one read of
// each resource (its pages), none asked again.
func TestAPISlowLinkFiveThousand(t *testing.T) {
	if testing.Short() {
		gate.Skip(t, "writes 5,000 Services and waits minutes for a 64 kbit/s link")
	}
	gate.Root(t)
	gate.Binaries(t, "iptables", "iptables-restore", "iptables-save", "tc")
	bin := agentBinary(t)
	const services, endpoints = 5000, 10

	node := netns.NewNode(t, "node")
	hostIP, nodeIP := node.LinkHost()
	cl := cluster.New(t, cluster.Options{BindAddress: hostIP.String(), Audit: true})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	t.Cleanup(cancel)
	if _, err := cl.CreateNode(ctx, nodeName, "zone-a", nodeIP.String()); err != nil {
		t.Fatal(err)
	}
	drv, err := bench.NewDriver(cl.RESTConfig(), "slow", endpoints)
	if err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	if err := drv.Grow(ctx, services); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d Services written in %v", services, time.Since(written).Round(time.Second))

	// The link: a token bucket on each end of the node's veth, a frame of
	// burst and a second of queue, as in the bench (bench.World.Shape).
	hostIf := fmt.Sprintf("ephost%d", hostIP.As4()[3]-1)
	tbf := []string{"root", "tbf", "rate", "64kbit", "burst", "1600", "latency", "1s"}
	if out, err := runHost("tc", append([]string{"qdisc", "replace", "dev", hostIf}, tbf...)...); err != nil {
		t.Fatalf("tc on %s: %v: %s", hostIf, err, out)
	}
	t.Cleanup(func() { _, _ = runHost("tc", "qdisc", "del", "dev", hostIf, "root") })
	if out, err := node.Run("tc", append([]string{"qdisc", "replace", "dev", "host0"}, tbf...)...); err != nil {
		t.Fatalf("tc in the node: %v: %s", err, out)
	}

	dir, cfg := apiAgentConfig(t, &apiWorld{c: cl, ctx: ctx, hostIP: hostIP}, "")
	before := hostBytes(t, hostIf)
	started := time.Now()
	startAgent(t, node, bin, cfg, filepath.Join(dir, "agent.log"))
	want := services * endpoints
	// Every 5 s: iptables-save of 50,000 rules is not free.
	for deadline := started.Add(10 * time.Minute); ; time.Sleep(5 * time.Second) {
		save, err := node.Run("iptables-save", "-t", "nat")
		n := strings.Count(save, "-j DNAT")
		if err == nil && n >= want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d DNAT rules of %d after %v (%v)", n, want, time.Since(started).Round(time.Second), err)
		}
	}
	took := time.Since(started)
	moved := hostBytes(t, hostIf) - before

	evs, err := cl.AuditEvents("edgeproxy", started)
	if err != nil {
		t.Fatal(err)
	}
	reads := map[string]int{}
	for _, e := range evs {
		if r := e.Read(); r == "list" || r == "list-page" {
			reads[r+" "+e.Resource()]++
		}
	}
	t.Logf("converged in %v; %d bytes on the link (both ways, Ethernet frames); reads %v", took.Round(time.Second), moved, reads)
	for _, res := range []string{"services", "endpointslices", "nodes"} {
		if reads["list "+res] == 0 {
			t.Errorf("no LIST of %s", res)
		}
	}
	// One full read each (no proxyName: one Service informer, as
	// kube-proxy's); no list asked again after a reset.
	if reads["list services"] != 1 || reads["list endpointslices"] != 1 || reads["list nodes"] != 1 {
		t.Errorf("reads %v: want the Services, the slices and the Node listed once", reads)
	}
	if reads["list-page endpointslices"] < services/1000-1 {
		t.Errorf("reads %v: want the slices in pages", reads)
	}
}

// runHost runs a command in the test's own namespace.
func runHost(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}

// hostBytes is what the host side of the node's veth moved both ways.
func hostBytes(t *testing.T, ifname string) int64 {
	t.Helper()
	var sum int64
	for _, f := range []string{"rx_bytes", "tx_bytes"} {
		b, err := os.ReadFile(filepath.Join("/sys/class/net", ifname, "statistics", f))
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		sum += n
	}
	return sum
}
