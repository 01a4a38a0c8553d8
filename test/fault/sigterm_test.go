package fault

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/test/agenttest"
)

const sigtermServices = 2000

// SIGTERM while iptables-restore programs a large first sync: the agent
// ends promptly; the kernel holds all of the plan's service rules or none
// (iptables-restore commits a table at once), never part of a table; and
// the next start programs (or adopts) them, so every Service answers.
func TestSIGTERMInTheMiddleOfASync(t *testing.T) {
	gate.Root(t)
	gate.Binaries(t, "iptables", "iptables-restore", "iptables-save")
	node := netns.NewNode(t, "sigterm")
	a, client := node.AddPod("a"), node.AddPod("client")
	if err := a.Serve(podPort); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	manifests := filepath.Join(dir, "manifests")
	if err := os.Mkdir(manifests, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(manifests, "services.yaml"), []byte(manyServices(a.IP, sigtermServices)), 0o644); err != nil {
		t.Fatal(err)
	}
	ag := agenttest.Start(t, agenttest.Options{NetNS: node.Name, Config: fmt.Sprintf(`nodeName: node1
manifests: %s
mode: iptables
clusterCIDR: 10.244.0.0/16
stateDir: %s
sync: {minPeriod: 100ms, period: 1h}
`, manifests, filepath.Join(dir, "state"))})

	restore := waitForRestore(t, ag.ConfigPath, 60*time.Second)
	t.Logf("iptables-restore (pid %d) running: sending SIGTERM", restore)
	start := time.Now()
	ag.Stop()
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the agent took %v to stop", took)
	}
	if n := serviceJumps(t, node); n != 0 && n != sigtermServices {
		t.Fatalf("after SIGTERM the kernel holds %d of %d service rules: a half-written table", n, sigtermServices)
	} else {
		t.Logf("after SIGTERM the kernel holds %d of %d service rules", n, sigtermServices)
	}

	ag.Restart()
	for _, i := range []int{0, sigtermServices / 2, sigtermServices - 1} {
		vip := netip.AddrPortFrom(serviceIP(i), 80)
		ag.Eventually(30*time.Second, "Service "+vip.String()+" answers", func() error {
			r, err := client.TCP(vip, time.Second)
			if err == nil && r.Name != "a" {
				err = fmt.Errorf("answered by %q", r.Name)
			}
			return err
		})
	}
	if n := serviceJumps(t, node); n != sigtermServices {
		t.Errorf("after the restart the kernel holds %d of %d service rules", n, sigtermServices)
	}
}

func serviceIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 96, byte(1 + i/250), byte(1 + i%250)})
}

// manyServices is n ClusterIP Services on port 80, each with pod ip as
// its one endpoint.
func manyServices(ip netip.Addr, n int) string {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: Node\nmetadata: {name: node1}\nstatus: {addresses: [{type: InternalIP, address: 192.168.77.1}]}\n")
	for i := range n {
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: Service
metadata: {name: s%[1]d, namespace: f}
spec: {clusterIP: %[2]s, clusterIPs: [%[2]s], ports: [{name: http, port: 80, protocol: TCP, targetPort: %[4]d}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s%[1]d-1, namespace: f, labels: {kubernetes.io/service-name: s%[1]d}}
addressType: IPv4
ports: [{name: http, port: %[4]d, protocol: TCP}]
endpoints: [{addresses: [%[3]s], nodeName: node1, conditions: {ready: true}}]
`, i, serviceIP(i), ip, podPort)
	}
	return b.String()
}

// serviceJumps counts the ClusterIPs with rules in the nat table's
// services chain.
func serviceJumps(t *testing.T, node *netns.Node) int {
	t.Helper()
	out, err := node.Run("iptables-save", "-t", "nat")
	if err != nil {
		t.Fatal(err)
	}
	vips := map[string]bool{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || f[0] != "-A" || f[1] != "EP-SERVICES" {
			continue
		}
		for i := range len(f) - 1 {
			if f[i] == "-d" && strings.HasPrefix(f[i+1], "10.96.") {
				vips[f[i+1]] = true
			}
		}
	}
	return len(vips)
}

// waitForRestore finds the agent started with configPath and returns the
// pid of an iptables-restore it runs, polling until one runs.
func waitForRestore(t *testing.T, configPath string, timeout time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range procs {
			cmd, err := os.ReadFile(p)
			if err != nil || !strings.Contains(string(cmd), "restore") {
				continue
			}
			pid, _ := strconv.Atoi(strings.Split(p, "/")[2])
			if parentRunsConfig(pid, configPath) {
				return pid
			}
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("no iptables-restore of the agent seen within %v", timeout)
	return 0
}

func parentRunsConfig(pid int, configPath string) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(f) < 2 {
		return false
	}
	cmd, err := os.ReadFile("/proc/" + f[1] + "/cmdline")
	return err == nil && strings.Contains(string(cmd), configPath)
}
