package proxies

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/agent/config"
)

var testNode = Node{Name: "node-a", Kubeconfig: "/k", MetricsAddr: "127.0.0.1:10249", HealthzAddr: "0.0.0.0:10256"}

// The edgeproxy config the harnesses write is one edgeproxy accepts, with
// the settings kube-proxy gets as flags.
func TestEdgeProxyConfigLoads(t *testing.T) {
	s := Settings{Backend: "nft", MinSync: time.Second, Sync: 30 * time.Second,
		ClusterCIDR: "10.244.0.0/16,fd00:244::/48", NodePortAddresses: []string{"192.168.77.0/24"}, ExternalIPs: true}
	cfg := loadConfig(t, s)
	if cfg.NodeName != "node-a" || !cfg.ExternalIPs || len(cfg.NodePortAddresses) != 1 || cfg.Sync.MinPeriod != time.Second {
		t.Errorf("loaded %+v", cfg)
	}
	args := KubeProxyArgs(testNode, s)
	for _, want := range []string{"--proxy-mode=iptables", "--hostname-override=node-a", "--cluster-cidr=10.244.0.0/16,fd00:244::/48", "--nodeport-addresses=192.168.77.0/24", "--iptables-min-sync-period=1s"} {
		if !slices.Contains(args, want) {
			t.Errorf("kube-proxy args %v lack %s", args, want)
		}
	}
	nft := KubeProxyNFTablesArgs(testNode, s)
	if !slices.Contains(nft, "--proxy-mode=nftables") || slices.Contains(nft, "--proxy-mode=iptables") || len(nft) != len(args) {
		t.Errorf("kube-proxy nftables args %v: want the iptables args in nftables mode", nft)
	}
	// kube-proxy has no --nftables-* sync flags: nftables mode reads the
	// --iptables-* ones, and an unknown flag makes it exit at once.
	for _, want := range []string{"--iptables-min-sync-period=1s", "--iptables-sync-period=" + s.Sync.String()} {
		if !slices.Contains(nft, want) {
			t.Errorf("kube-proxy nftables args %v lack %s", nft, want)
		}
	}
}

// In IPVS mode both proxies get their mode and kube-proxy its IPVS sync
// flags.
func TestIPVSMode(t *testing.T) {
	s := Settings{Mode: ModeIPVS, Backend: "nft", MinSync: time.Second, Sync: 30 * time.Second, ClusterCIDR: "10.244.0.0/16"}
	if cfg := loadConfig(t, s); cfg.Mode != config.ModeIPVS {
		t.Errorf("edgeproxy mode %q, want ipvs", cfg.Mode)
	}
	args := KubeProxyArgs(testNode, s)
	for _, want := range []string{"--proxy-mode=ipvs", "--ipvs-min-sync-period=1s", "--ipvs-sync-period=30s"} {
		if !slices.Contains(args, want) {
			t.Errorf("kube-proxy args %v lack %s", args, want)
		}
	}
}

// In nftables mode both proxies get their mode, and kube-proxy the
// --iptables-* sync flags (it has no --nftables-* ones).
func TestNFTablesMode(t *testing.T) {
	s := Settings{Mode: ModeNFTables, Backend: "nft", MinSync: time.Second, Sync: 30 * time.Second, ClusterCIDR: "10.244.0.0/16"}
	if cfg := loadConfig(t, s); cfg.Mode != config.ModeNFTables {
		t.Errorf("edgeproxy mode %q, want nftables", cfg.Mode)
	}
	args := KubeProxyArgs(testNode, s)
	for _, want := range []string{"--proxy-mode=nftables", "--iptables-min-sync-period=1s", "--iptables-sync-period=30s"} {
		if !slices.Contains(args, want) {
			t.Errorf("kube-proxy args %v lack %s", args, want)
		}
	}
	if !slices.Equal(args, KubeProxyNFTablesArgs(testNode, s)) {
		t.Errorf("KubeProxyArgs in nftables mode %v, KubeProxyNFTablesArgs %v: want the same", args, KubeProxyNFTablesArgs(testNode, s))
	}
}

// loadConfig writes EdgeProxyConfig for s and loads it as edgeproxy does.
func loadConfig(t *testing.T, s Settings) *config.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "edgeproxy.yaml")
	if err := os.WriteFile(path, []byte(EdgeProxyConfig(testNode, s, t.TempDir())), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(config.LoadOptions{File: path})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// The local-traffic detection settings reach both proxies, each in its
// own spelling.
func TestDetectLocalSettings(t *testing.T) {
	for _, s := range []Settings{
		{DetectLocalMode: "BridgeInterface", PodBridgeInterface: "br0", ClusterCIDR: "10.244.0.0/16"},
		{DetectLocalMode: "InterfaceNamePrefix", PodInterfaceNamePrefix: "veth", MasqueradeAll: true},
	} {
		s.MinSync, s.Sync = time.Second, 30*time.Second
		cfg := loadConfig(t, s)
		if cfg.DetectLocalMode != s.DetectLocalMode || cfg.DetectLocal.BridgeInterface != s.PodBridgeInterface ||
			cfg.DetectLocal.InterfaceNamePrefix != s.PodInterfaceNamePrefix || cfg.MasqueradeAll != s.MasqueradeAll {
			t.Errorf("%+v: edgeproxy loaded %q %+v masqueradeAll %v", s, cfg.DetectLocalMode, cfg.DetectLocal, cfg.MasqueradeAll)
		}
		args := KubeProxyArgs(testNode, s)
		want := []string{"--detect-local-mode=" + s.DetectLocalMode}
		if s.PodBridgeInterface != "" {
			want = append(want, "--pod-bridge-interface="+s.PodBridgeInterface)
		}
		if s.PodInterfaceNamePrefix != "" {
			want = append(want, "--pod-interface-name-prefix="+s.PodInterfaceNamePrefix)
		}
		for _, w := range want {
			if !slices.Contains(args, w) {
				t.Errorf("kube-proxy args %v lack %s", args, w)
			}
		}
		// kube-proxy refuses an empty --cluster-cidr.
		if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--cluster-cidr=") }) != (s.ClusterCIDR != "") {
			t.Errorf("kube-proxy args %v: --cluster-cidr for %q", args, s.ClusterCIDR)
		}
		if slices.Contains(args, "--masquerade-all=true") != s.MasqueradeAll {
			t.Errorf("kube-proxy args %v: --masquerade-all, want %v", args, s.MasqueradeAll)
		}
	}
	if cfg := loadConfig(t, Settings{MinSync: time.Second, Sync: time.Minute}); cfg.DetectLocalMode != "ClusterCIDR" || cfg.MasqueradeAll {
		t.Errorf("no settings: edgeproxy %q masqueradeAll %v, want kube-proxy's defaults", cfg.DetectLocalMode, cfg.MasqueradeAll)
	}
}
