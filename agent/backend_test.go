package agent

import (
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/edgeproxy/edgeproxy/agent/config"
)

// IPv6 is proxied as kube-proxy decides it: the kernel has IPv6 on and
// ip6tables works. The node's addresses play no part (ipv6Supported is
// not given them).
func TestIPv6Supported(t *testing.T) {
	works := func() error { return nil }
	broken := func() error { return errors.New("can't initialize ip6tables table `nat'") }
	for _, tc := range []struct {
		name      string
		ifInet6   bool   // /proc/net/if_inet6 exists
		disable   string // /proc/sys/net/ipv6/conf/all/disable_ipv6, "" none
		ip6tables func() error
		want      bool
	}{
		{"IPv6 on, ip6tables works", true, "0\n", works, true},
		{"no disable_ipv6 file", true, "", works, true},
		{"kernel without IPv6", false, "", works, false},
		{"IPv6 disabled", true, "1\n", works, false},
		{"ip6tables fails", true, "0\n", broken, false},
	} {
		proc := t.TempDir()
		if tc.ifInet6 {
			write(t, filepath.Join(proc, "net/if_inet6"), "")
		}
		if tc.disable != "" {
			write(t, filepath.Join(proc, "sys/net/ipv6/conf/all/disable_ipv6"), tc.disable)
		}
		err := ipv6Supported(proc, tc.ip6tables)
		if got := err == nil; got != tc.want {
			t.Errorf("%s: ipv6Supported = %v, want supported %v", tc.name, err, tc.want)
		}
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// detectLocalMode picks what the datapaths tell pods by, as kube-proxy's
// getLocalDetectors: clusterCIDR only in its own mode, the Node's ranges,
// the bridge's name, or the prefix as iptables' "prefix+".
func TestDetectLocal(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	base := config.Default()
	base.ClusterCIDR = "10.244.0.0/16,fd00:244::/56"
	base.DetectLocal = config.DetectLocal{BridgeInterface: "cni0", InterfaceNamePrefix: "veth"}
	for _, tc := range []struct {
		mode string
		want podDetector
	}{
		{config.LocalModeClusterCIDR, podDetector{cidrs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/56")}}},
		{config.LocalModeNodeCIDR, podDetector{node: true}},
		{config.LocalModeBridgeInterface, podDetector{iface: "cni0"}},
		{config.LocalModeInterfaceNamePrefix, podDetector{iface: "veth+"}},
	} {
		cfg := base
		cfg.DetectLocalMode = tc.mode
		if got := detectLocal(&cfg, log); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %+v, want %+v", tc.mode, got, tc.want)
		}
		if o := iptablesOptions(&cfg, log, nil); !slices.Equal(o.ClusterCIDRs, tc.want.cidrs) || o.NodePodCIDRs != tc.want.node || o.PodInterface != tc.want.iface {
			t.Errorf("%s: iptables options %v %v %q", tc.mode, o.ClusterCIDRs, o.NodePodCIDRs, o.PodInterface)
		}
		if o := ipvsOptions(&cfg, log, nil); !slices.Equal(o.ClusterCIDRs, tc.want.cidrs) || o.NodePodCIDRs != tc.want.node || o.PodInterface != tc.want.iface {
			t.Errorf("%s: ipvs options %v %v %q", tc.mode, o.ClusterCIDRs, o.NodePodCIDRs, o.PodInterface)
		}
	}
}

// IPv6 forwarding is turned on only where the node routes IPv6 already:
// the test the agent used to decide IPv6 by, kept for the sysctl alone.
func TestHasIPv6(t *testing.T) {
	a, p := netip.MustParseAddr, netip.MustParsePrefix
	for _, tc := range []struct {
		name  string
		cidrs []netip.Prefix
		addrs []netip.Addr
		want  bool
	}{
		{"IPv4 only", []netip.Prefix{p("10.244.0.0/16")}, []netip.Addr{a("192.168.1.2"), a("127.0.0.1"), a("::1"), a("fe80::1")}, false},
		{"a global IPv6 address", []netip.Prefix{p("10.244.0.0/16")}, []netip.Addr{a("192.168.1.2"), a("fd00:77::1")}, true},
		{"IPv6 clusterCIDR", []netip.Prefix{p("fd00:244::/56")}, nil, true},
	} {
		if got := hasIPv6(tc.cidrs, tc.addrs); got != tc.want {
			t.Errorf("%s: hasIPv6 = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestNFTablesNodePortDefault: unset nodePortAddresses is [primary] in
// nftables mode, as kube-proxy's nftables mode defaults it, and only there.
func TestNFTablesNodePortDefault(t *testing.T) {
	quiet := slog.New(slog.DiscardHandler)
	def := config.Default()
	cfg := &def
	if o := nftablesSettings(cfg, quiet); !o.NodePortPrimary || len(o.NodePortAddresses) != 0 {
		t.Errorf("nftables, unset: primary %v, prefixes %v; want primary alone", o.NodePortPrimary, o.NodePortAddresses)
	}
	if o := iptablesSettings(cfg, quiet); o.NodePortPrimary {
		t.Error("iptables, unset: primary; want every local address, as kube-proxy's iptables mode")
	}
	cfg.NodePortAddresses = []string{"10.0.0.0/8"}
	if o := nftablesSettings(cfg, quiet); o.NodePortPrimary || len(o.NodePortAddresses) != 1 {
		t.Errorf("nftables, 10.0.0.0/8: primary %v, prefixes %v; want the prefix alone", o.NodePortPrimary, o.NodePortAddresses)
	}
}
