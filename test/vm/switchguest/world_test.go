package switchguest

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath/ipvs"
	"github.com/edgeproxy/edgeproxy/datapath/sysctl"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/internal/testkit/poll"
	"github.com/edgeproxy/edgeproxy/internal/testkit/switchload"
	"github.com/edgeproxy/edgeproxy/internal/testkit/vm"
	"github.com/edgeproxy/edgeproxy/test/proxies"
)

// world is the guest's half of the switch world the host set up: the
// node, its pods and client, the user's virtual server, edgeproxy's
// configuration per mode, and the requests to the host.
type world struct {
	t        *testing.T
	setup    Setup
	start    time.Time
	node     *netns.Node
	pods     map[string]*netns.Pod
	client   *netns.NS
	dir      string            // the guest's own scratch directory
	path     string            // PATH with the nft backend's iptables first
	pn       proxies.Node      // the node as the proxies are told it
	settings proxies.Settings  // both proxies' settings (Mode: ipvs)
	configs  map[string]string // edgeproxy's configuration file per mode
	requests int
	runs     int
}

// newWorld builds the node, pods a, b and c (each serving PodPort and
// HeldPort) and the client as the host's API objects say, sizes the
// conntrack table as a node's, adds the user's virtual server, and writes
// edgeproxy's configuration for each of modes. It skips unless the host
// started it (-switch.dir).
func newWorld(t *testing.T, modes ...string) *world {
	vm.Guest(t)
	gate.Root(t)
	if *sharedDir == "" {
		t.Skip("started by a test/vm switch test, with -switch.dir")
	}
	gate.Binaries(t, "iptables-nft", "iptables-nft-save", "iptables-legacy-save", "ipset")
	b, err := os.ReadFile(filepath.Join(*sharedDir, "setup.json"))
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, start: time.Now(), pods: map[string]*netns.Pod{}, configs: map[string]string{}}
	if err := json.Unmarshal(b, &w.setup); err != nil {
		t.Fatalf("setup.json: %v", err)
	}
	// The conntrack table as both proxies size it on a node (32768 per
	// core, at least 131072: kube-proxy's conntrack settings, edgeproxy's
	// conntrack.maxPerCore and min); neither can here, where the node is a
	// namespace and nf_conntrack_max belongs to the VM's host namespace.
	// The kernel sizes it by the VM's 1 GiB to some 8,000 entries, which
	// the stream (a TCP entry stays 2 minutes in TIME_WAIT) filled on the
	// way back: conntrack counted early drops and drops, and a few new
	// connections failed.
	if out, err := exec.Command("modprobe", "nf_conntrack").CombinedOutput(); err != nil {
		t.Fatalf("modprobe nf_conntrack: %v: %s", err, out)
	}
	was, _ := sysctl.Get("net/netfilter/nf_conntrack_max")
	if err := sysctl.Set("net/netfilter/nf_conntrack_max", strconv.Itoa(conntrackMax)); err != nil {
		t.Fatal(err)
	}
	t.Logf("nf_conntrack_max %d (the kernel's: %s)", conntrackMax, was)

	w.node = netns.NewNode(t, "node")
	for _, name := range []string{"a", "b", "c"} {
		p := w.node.AddPod(name)
		if p.IP != PodIPs[name] {
			t.Fatalf("pod %s has %s, the host made it %s", name, p.IP, PodIPs[name])
		}
		if err := p.Serve(PodPort); err != nil {
			t.Fatal(err)
		}
		if err := switchload.ServeHeld(t, p, HeldPort); err != nil {
			t.Fatal(err)
		}
		w.pods[name] = p
	}
	w.client = w.node.AddClient("client")
	if w.node.LinkIP != NodeIP {
		t.Fatalf("node link %s, the host's Node says %s", w.node.LinkIP, NodeIP)
	}
	for _, n := range []*netns.NS{w.node.NS, w.pods["a"].NS, w.pods["b"].NS, w.pods["c"].NS, w.client} {
		if err := n.NoTimeWait(); err != nil {
			t.Fatal(err)
		}
	}
	vm.RelayToHost(t, w.node.NS, w.setup.APIPort)
	if err := w.node.Do(func() error {
		k, err := ipvs.Open()
		if err != nil {
			return err
		}
		defer k.Close()
		if err := k.AddVirtualServer(userVS); err != nil {
			return err
		}
		return k.AddRealServer(userVS, ipvs.RealServer{Addr: w.pods["a"].AddrPort(PodPort), Weight: 1})
	}); err != nil {
		t.Fatalf("the user's virtual server: %v", err)
	}

	w.dir = t.TempDir()
	if w.path, err = proxies.BackendPath(w.dir, "nft"); err != nil {
		t.Fatal(err)
	}
	w.pn = proxies.Node{Name: NodeName, Kubeconfig: filepath.Join(*sharedDir, "kubeconfig"), MetricsAddr: "127.0.0.1:10249", HealthzAddr: "0.0.0.0:10256"}
	w.settings = proxies.Settings{Mode: proxies.ModeIPVS, Backend: "nft", MinSync: 200 * time.Millisecond, Sync: 30 * time.Second, ClusterCIDR: "10.244.0.0/16"}
	for _, mode := range modes {
		s := w.settings
		s.Mode = mode
		w.configs[mode] = filepath.Join(w.dir, "edgeproxy-"+mode+".yaml")
		if err := os.WriteFile(w.configs[mode], []byte(proxies.EdgeProxyConfig(w.pn, s, filepath.Join(w.dir, "state-"+mode))), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, cmd := range [][]string{{"iptables-nft-save"}, {"ipvsadm", "-Ln"}, {"ipset", "list", "-n"}, {"ip", "addr"}, {"nft", "list", "tables"}} {
				out, _ := w.node.Run(cmd[0], cmd[1:]...)
				t.Logf("%s in the node:\n%s", strings.Join(cmd, " "), out)
			}
		}
	})
	return w
}

// host asks the host to "delete" or "add" a pod, and waits for it.
func (w *world) host(op, pod string) {
	w.t.Helper()
	w.requests++
	if err := ask(*sharedDir, w.requests, Request{Op: op, Pod: pod}, 2*time.Minute); err != nil {
		w.t.Fatal(err)
	}
}

// startProxy starts kube-proxy (in IPVS mode) or edgeproxy in mode, in the
// node, its log in the scratch directory.
func (w *world) startProxy(kind proxies.Kind, mode string) *proxies.Process {
	t := w.t
	t.Helper()
	var args []string
	switch kind {
	case proxies.KubeProxy:
		// kube-proxy deletes every virtual server of the node it
		// does not program (cleanLegacyService) unless told to
		// leave an address range: a user with IPVS services of
		// their own tells it.
		args = append([]string{w.setup.KubeProxy}, proxies.KubeProxyArgs(w.pn, w.settings)...)
		args = append(args, "--ipvs-exclude-cidrs="+netip.PrefixFrom(userVS.Addr, 32).String(), "--v=4")
	case proxies.EdgeProxy:
		cfg, ok := w.configs[mode]
		if !ok {
			t.Fatalf("no edgeproxy configuration for mode %s", mode)
		}
		args = []string{w.setup.EdgeProxy, "run", "--config", cfg}
	}
	w.runs++
	logPath := filepath.Join(w.dir, fmt.Sprintf("%d-%s.log", w.runs, kind))
	return proxies.StartLogged(t, w.node.Do, string(kind), logPath, guestEnv(w.path), args...)
}

// synced waits until the proxy has finished a sync: kube-proxy has
// observed a whole IPv4 sync (the duration metric is observed when
// syncProxyRules returns, after its conntrack cleanup), edgeproxy's
// status reports its takeover (which follows its first sync and the
// removal of what another mode left) in mode.
func (w *world) synced(kind proxies.Kind, mode string, p *proxies.Process) {
	t := w.t
	t.Helper()
	poll.Until(t, 4*time.Minute, string(kind)+" synced", func() error {
		if err := p.Exited(); err != nil {
			t.Fatal(err)
		}
		if kind == proxies.EdgeProxy {
			body, err := w.node.GET(w.pn.MetricsAddr, "/debug/status", 5*time.Second)
			if err != nil {
				return err
			}
			if !strings.Contains(body, `"kubeProxy"`) {
				return errors.New("no takeover in the status yet")
			}
			if !strings.Contains(body, `"mode": "`+mode+`"`) {
				return fmt.Errorf("the status does not report mode %s", mode)
			}
			return nil
		}
		body, err := w.node.GET(w.pn.MetricsAddr, "/metrics", 5*time.Second)
		if err != nil {
			return err
		}
		if !proxies.Nonzero(body, proxies.MetricSyncCount, "IPv4") {
			return errors.New("no whole IPv4 sync in kube-proxy's metrics yet")
		}
		return nil
	})
}

// reaches waits until a TCP connection from the client to vip:80 is
// answered by pod name.
func (w *world) reaches(vip netip.Addr, name string) {
	w.t.Helper()
	poll.Until(w.t, 90*time.Second, fmt.Sprintf("%s reaches %s", vip, name), func() error {
		for range 30 {
			if r, err := w.client.TCP(netip.AddrPortFrom(vip, 80), 2*time.Second); err == nil && r.Name == name {
				return nil
			}
		}
		return fmt.Errorf("no connection reached %s", name)
	})
}

// logPhases logs the lines of an edgeproxy log that say where its start
// went (under TCG: minutes, not seconds).
func logPhases(t *testing.T, what, log string) {
	out, err := os.ReadFile(log)
	if err != nil {
		return
	}
	for _, l := range strings.Split(string(out), "\n") {
		for _, m := range []string{"edgeproxy starting", "waiting for the source", "first sync done", "took over from kube-proxy", "removed"} {
			if strings.Contains(l, m) {
				t.Logf("%s: %s", what, l)
				break
			}
		}
	}
}

// judge logs one switch's counts and fails t unless, after the switch, no
// new connection failed, none reached the deleted endpoint and at least
// 100 were made, and, where keepsFlows, no established flow broke (else
// the broken ones are logged: why says why they may break).
func judge(t *testing.T, what string, res switchload.Result, keepsFlows bool, why string) {
	t.Helper()
	t.Logf("%s: %s", what, res)
	t.Logf("%s: the longest an established flow went without an exchange: %s, until %s", what,
		res.MaxGap.Round(time.Millisecond), res.MaxGapEnd.Format("15:04:05.000"))
	if len(res.Failures) > 0 {
		t.Logf("%s: the failed new connections (started–ended):\n%s", what, strings.Join(res.Failures, "\n"))
	}
	if !keepsFlows {
		t.Logf("%s: established flows broken: %d of %d TCP, %d of %d UDP (%s)", what, res.HeldBroken, res.Held, res.UDPBroken, res.UDP, why)
	}
	broken := res.HeldBroken != 0 || res.UDPBroken != 0
	if res.FailedAfter != 0 || res.GoneAfter != 0 || keepsFlows && broken || res.NewAfter < 100 {
		t.Errorf("%s: %s; want 0 failed after the switch, 0 to the deleted endpoint, at least 100 after it, and 0 established flows broken (unless %s)", what, res, why)
	}
}
