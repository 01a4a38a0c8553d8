// Package proxies starts the Service proxies the harnesses compare —
// upstream kube-proxy and edgeproxy, both in iptables, IPVS or nftables
// mode (and, for the benchmarks, kube-proxy in nftables mode beside
// edgeproxy in another) — with the
// same settings, and empties a node namespace between them. The
// benchmarks (test/bench) and the conformance matrix (test/conformance)
// share it, so both proxies are configured in one place and their
// metrics are read one way (ParseMetrics).
//
// The iptables backend (legacy or nft) is chosen the same way for both: a
// directory whose iptables, iptables-save and iptables-restore (and the
// ip6tables ones) link to the backend's programs is put first in PATH.
package proxies

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Kind names a proxy under test.
type Kind string

// The proxies the harnesses run.
const (
	KubeProxy Kind = "kube-proxy"
	EdgeProxy Kind = "edgeproxy"
	// KubeProxyNFTables is kube-proxy --proxy-mode=nftables: its own
	// tables through the nft program, whatever the iptables backend.
	KubeProxyNFTables Kind = "kube-proxy-nftables"
)

// Settings are what both proxies are given, the same for both.
type Settings struct {
	// Mode is ModeIPTables (also when empty), ModeIPVS or ModeNFTables;
	// IPVS mode still writes iptables rules, with Backend's programs, and
	// Backend's are the iptables programs in PATH in nftables mode too
	// (kube-proxy cleans the other modes' rules up with them).
	Mode        string
	Backend     string        // legacy | nft
	MinSync     time.Duration // kube-proxy --<mode>-min-sync-period, edgeproxy sync.minPeriod
	Sync        time.Duration // kube-proxy --<mode>-sync-period, edgeproxy sync.period
	ClusterCIDR string        // masquerade traffic to ClusterIPs from outside it; comma-separated, one per family
	// NodePortAddresses limits NodePorts to the node's addresses in these
	// CIDRs (kube-proxy --nodeport-addresses); empty: every address.
	NodePortAddresses []string
	// ExternalIPs turns on spec.externalIPs in edgeproxy, where they are
	// opt-in; kube-proxy always programs them.
	ExternalIPs bool
	// DetectLocalMode is how traffic from pods is told from other
	// traffic (kube-proxy --detect-local-mode, edgeproxy
	// detectLocalMode); empty: each proxy's default, ClusterCIDR.
	DetectLocalMode string
	// PodBridgeInterface and PodInterfaceNamePrefix are what the
	// BridgeInterface and InterfaceNamePrefix modes match (kube-proxy
	// --pod-bridge-interface and --pod-interface-name-prefix, edgeproxy
	// detectLocal.bridgeInterface and detectLocal.interfaceNamePrefix).
	PodBridgeInterface     string
	PodInterfaceNamePrefix string
	// MasqueradeAll masquerades all traffic to Service addresses
	// (kube-proxy --masquerade-all, edgeproxy masqueradeAll).
	MasqueradeAll bool
}

// The proxy modes both proxies share.
const (
	ModeIPTables = "iptables"
	ModeIPVS     = "ipvs"
	ModeNFTables = "nftables"
)

// mode is s.Mode with its default.
func (s Settings) mode() string {
	if s.Mode == "" {
		return ModeIPTables
	}
	return s.Mode
}

// Node is where a proxy runs and how it is reached.
type Node struct {
	Name        string // the Node object (--hostname-override, nodeName)
	Kubeconfig  string // reaches the API server from inside the node
	MetricsAddr string // host:port of /metrics
	HealthzAddr string // host:port of /healthz
}

// KubeProxyArgs are kube-proxy's flags for s: its mode, no conntrack
// table sizing (nf_conntrack_max cannot be written from a network
// namespace), verbosity 2.
func KubeProxyArgs(n Node, s Settings) []string { return kubeProxyArgs(s.mode(), n, s) }

// KubeProxyNFTablesArgs are the same flags in nftables mode. The
// --iptables-*sync-period flags set the sync periods of every mode but
// IPVS (kube-proxy's options.go), so the settings stay the same.
func KubeProxyNFTablesArgs(n Node, s Settings) []string { return kubeProxyArgs("nftables", n, s) }

func kubeProxyArgs(mode string, n Node, s Settings) []string {
	// The sync-period flags are --ipvs-* in IPVS mode and --iptables-* in
	// every other mode, nftables included (kube-proxy has no --nftables-*).
	syncFlags := "iptables"
	if mode == ModeIPVS {
		syncFlags = "ipvs"
	}
	args := []string{
		"--proxy-mode=" + mode,
		"--kubeconfig=" + n.Kubeconfig,
		"--hostname-override=" + n.Name,
		"--conntrack-max-per-core=0",
		"--" + syncFlags + "-min-sync-period=" + s.MinSync.String(),
		"--" + syncFlags + "-sync-period=" + s.Sync.String(),
		"--metrics-bind-address=" + n.MetricsAddr,
		"--healthz-bind-address=" + n.HealthzAddr,
		"--v=2",
	}
	// An empty --cluster-cidr fails kube-proxy's validation: no
	// clusterCIDR is the flag left out.
	if s.ClusterCIDR != "" {
		args = append(args, "--cluster-cidr="+s.ClusterCIDR)
	}
	if len(s.NodePortAddresses) > 0 {
		args = append(args, "--nodeport-addresses="+strings.Join(s.NodePortAddresses, ","))
	}
	if s.DetectLocalMode != "" {
		args = append(args, "--detect-local-mode="+s.DetectLocalMode)
	}
	if s.PodBridgeInterface != "" {
		args = append(args, "--pod-bridge-interface="+s.PodBridgeInterface)
	}
	if s.PodInterfaceNamePrefix != "" {
		args = append(args, "--pod-interface-name-prefix="+s.PodInterfaceNamePrefix)
	}
	if s.MasqueradeAll {
		args = append(args, "--masquerade-all=true")
	}
	return args
}

// EdgeProxyConfig is edgeproxy's config file for s (its mode), keeping
// its state in stateDir.
func EdgeProxyConfig(n Node, s Settings, stateDir string) string {
	cfg := fmt.Sprintf(`nodeName: %s
kubeconfig: %s
mode: %s
clusterCIDR: %q
stateDir: %s
externalIPs: %t
sync:
  minPeriod: %s
  period: %s
server:
  healthz: %q
  metrics: %q
log:
  level: info
`, n.Name, n.Kubeconfig, s.mode(), s.ClusterCIDR, stateDir, s.ExternalIPs, s.MinSync, s.Sync, n.HealthzAddr, n.MetricsAddr)
	if len(s.NodePortAddresses) > 0 {
		cfg += "nodePortAddresses:\n"
		for _, a := range s.NodePortAddresses {
			cfg += fmt.Sprintf("  - %q\n", a)
		}
	}
	if s.DetectLocalMode != "" {
		cfg += fmt.Sprintf("detectLocalMode: %s\n", s.DetectLocalMode)
	}
	if s.PodBridgeInterface != "" || s.PodInterfaceNamePrefix != "" {
		cfg += fmt.Sprintf("detectLocal:\n  bridgeInterface: %q\n  interfaceNamePrefix: %q\n", s.PodBridgeInterface, s.PodInterfaceNamePrefix)
	}
	if s.MasqueradeAll {
		cfg += "masqueradeAll: true\n"
	}
	return cfg
}

// BackendPath makes a directory under dir whose iptables, iptables-save and
// iptables-restore (and the ip6tables ones) are the given backend's, to put
// first in a proxy's PATH. Both proxies find the backend the same way.
func BackendPath(dir, backend string) (string, error) {
	if backend != "legacy" && backend != "nft" {
		return "", fmt.Errorf("proxies: unknown iptables backend %q (want legacy or nft)", backend)
	}
	p := filepath.Join(dir, "path-"+backend)
	if err := os.MkdirAll(p, 0o755); err != nil {
		return "", fmt.Errorf("proxies: %w", err)
	}
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			target, err := exec.LookPath(fam + "-" + backend + suffix)
			if err != nil {
				return "", fmt.Errorf("proxies: %s not found (Debian package iptables): %w", fam+"-"+backend+suffix, err)
			}
			link := filepath.Join(p, fam+suffix)
			_ = os.Remove(link)
			if err := os.Symlink(target, link); err != nil {
				return "", fmt.Errorf("proxies: %w", err)
			}
		}
	}
	return p, nil
}

// Env is os.Environ() with the backend directory first in PATH.
func Env(backendPath string) []string {
	return append(os.Environ(), "PATH="+backendPath+":"+os.Getenv("PATH"))
}

// Runner runs a command inside the node namespace (netns.NS.Run and
// bench.Netns.Run have this shape).
type Runner func(name string, args ...string) (string, error)

// Reset empties a node namespace for the next proxy: every table of both
// iptables backends and of nf_tables, the conntrack table, and the one
// sysctl a proxy turns on that changes what packets do (route_localnet,
// for NodePorts on 127.0.0.1).
func Reset(run Runner) error {
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, table := range []string{"nat", "filter", "mangle"} {
			for _, op := range []string{"-F", "-X"} {
				if _, err := run(fam+"-legacy", "-w", "-t", table, op); err != nil {
					return fmt.Errorf("proxies: reset: %w", err)
				}
			}
		}
	}
	if _, err := run("nft", "flush", "ruleset"); err != nil {
		return fmt.Errorf("proxies: reset: %w", err)
	}
	if _, err := run("sysctl", "-qw", "net.ipv4.conf.all.route_localnet=0"); err != nil {
		return fmt.Errorf("proxies: reset: %w", err)
	}
	// conntrack -F fails on an empty table on some versions: not an error.
	_, _ = run("conntrack", "-F")
	_, _ = run("conntrack", "-F", "-f", "ipv6")
	return nil
}

// Process is a started proxy; Stop ends it.
type Process struct {
	Name string // for messages
	Log  string // where its output goes
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start starts cmd (its output already directed) and watches for its end.
func Start(name string, cmd *exec.Cmd, log string) (*Process, error) {
	p := &Process{Name: name, Log: log, cmd: cmd, done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("proxies: start %s: %w", name, err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	return p, nil
}

// PID is the process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited returns an error once the process has ended (a proxy must not,
// during a run).
func (p *Process) Exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("proxies: %s exited: %v (log %s)", p.Name, p.err, p.Log)
	default:
		return nil
	}
}

// Stop ends the process with SIGTERM, then SIGKILL after 10s, and waits.
func (p *Process) Stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}
