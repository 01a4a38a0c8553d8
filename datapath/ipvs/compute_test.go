package ipvs

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/ipset"
)

var update = flag.Bool("update", false, "rewrite golden files")

func ep(a string, w uint32) datapath.Endpoint {
	return datapath.Endpoint{Addr: netip.MustParseAddrPort(a), Weight: w}
}

// render prints the desired state in a stable form for comparison.
func (d *desired) String() string {
	var lines []string
	for _, s := range d.Servers {
		l := s.VS.String() + " ->"
		for _, r := range s.Reals {
			l += " " + r.String()
		}
		lines = append(lines, l)
	}
	slices.Sort(lines)
	var vips []string
	for a := range d.VIPs {
		vips = append(vips, a.String())
	}
	slices.Sort(vips)
	lines = append(lines, "vips: "+strings.Join(vips, " "))
	var names []string
	for n, es := range d.Entries {
		if len(es) > 0 {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	for _, n := range names {
		var es []string
		for _, e := range d.Entries[n] {
			es = append(es, e.String())
		}
		lines = append(lines, fmt.Sprintf("set %s: %s", n, strings.Join(es, " ")))
	}
	return strings.Join(lines, "\n") + "\n"
}

func TestCompute(t *testing.T) {
	cfg := config{Scheduler: "lc", NodeAddresses: []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("fd00::10")}}
	plan := &datapath.Plan{HealthCheckPorts: []uint16{31000}, Frontends: []datapath.Frontend{
		{Service: datapath.ServicePortName{Namespace: "a", Name: "web", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: netip.MustParseAddr("10.96.0.1"), Family: datapath.IPv4, Port: 80,
			Endpoints: []datapath.Endpoint{ep("10.244.0.2:8080", 1), ep("10.244.0.3:8080", 1)}},
		{Service: datapath.ServicePortName{Namespace: "a", Name: "canary", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: netip.MustParseAddr("10.96.0.2"), Family: datapath.IPv4, Port: 80,
			Endpoints: []datapath.Endpoint{ep("10.244.0.2:8080", 3), ep("10.244.0.3:8080", 1)}},
		{Service: datapath.ServicePortName{Namespace: "a", Name: "hash", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: netip.MustParseAddr("10.96.0.3"), Family: datapath.IPv4, Port: 80,
			Scheduler: "mh", SchedulerFlags: []string{"mh-fallback", "mh-port"}, Affinity: 90 * time.Second,
			Endpoints: []datapath.Endpoint{ep("10.244.0.2:8080", 3), ep("10.244.0.3:8080", 1)}},
		{Service: datapath.ServicePortName{Namespace: "a", Name: "np", Port: "dns"}, Kind: datapath.NodePort, Protocol: datapath.UDP, Family: datapath.IPv4, Port: 30053, LocalOnly: true,
			Endpoints: []datapath.Endpoint{ep("10.244.0.4:53", 1)}},
		{Service: datapath.ServicePortName{Namespace: "a", Name: "lb", Port: "http"}, Kind: datapath.LoadBalancer, Protocol: datapath.TCP, Addr: netip.MustParseAddr("203.0.113.5"), Family: datapath.IPv4, Port: 443,
			SourceRanges: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}},
		{Service: datapath.ServicePortName{Namespace: "a", Name: "ext", Port: "http"}, Kind: datapath.ExternalIP, Protocol: datapath.TCP, Addr: netip.MustParseAddr("203.0.113.6"), Family: datapath.IPv4, Port: 80,
			Endpoints: []datapath.Endpoint{ep("10.244.0.2:8080", 1)}},
	}}
	d, err := compute(cfg, plan)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "compute.golden", d.String())
}

// TestComputeDualStack: with IPv6 on, IPv6 frontends get IPv6 virtual
// servers, VIPs and the EP-6- sets; IPv4 ones are as without it.
func TestComputeDualStack(t *testing.T) {
	cfg := config{IPv6: true, NodeAddresses: []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("fd00::10")}}
	plan := &datapath.Plan{Frontends: []datapath.Frontend{
		{Service: datapath.ServicePortName{Namespace: "a", Name: "web", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: netip.MustParseAddr("10.96.0.1"), Family: datapath.IPv4, Port: 80,
			Endpoints: []datapath.Endpoint{ep("10.244.0.2:8080", 1)}},
		{Service: datapath.ServicePortName{Namespace: "a", Name: "web", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: netip.MustParseAddr("fd00:96::1"), Family: datapath.IPv6, Port: 80,
			Endpoints: []datapath.Endpoint{ep("[fd00:244::2]:8080", 1)}},
		{Service: datapath.ServicePortName{Namespace: "a", Name: "web", Port: "http"}, Kind: datapath.NodePort, Protocol: datapath.TCP, Family: datapath.IPv6, Port: 30080,
			Endpoints: []datapath.Endpoint{ep("[fd00:244::2]:8080", 1)}},
		{Service: datapath.ServicePortName{Namespace: "a", Name: "lb", Port: "http"}, Kind: datapath.LoadBalancer, Protocol: datapath.TCP, Addr: netip.MustParseAddr("2001:db8::5"), Family: datapath.IPv6, Port: 443,
			SourceRanges: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8:1::/48")}},
	}}
	d, err := compute(cfg, plan)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "compute-dualstack.golden", d.String())
}

// TestNoEndpointsSets: a frontend without endpoints is refused (as IPVS
// refuses a virtual server without real servers), also with a Local
// policy when its service has no endpoint anywhere or only internal
// policy Local; only an external frontend of policy Local whose endpoints
// are all on other nodes (Drop) goes to the set whose outsiders are
// dropped, and its virtual server gets the cluster-wide endpoints.
func TestNoEndpointsSets(t *testing.T) {
	remote := []datapath.Endpoint{ep("10.244.1.2:8080", 1)}
	for _, c := range []struct {
		name            string
		kind            datapath.Kind
		localOnly, drop bool
		cluster         []datapath.Endpoint
		want            string
		reals           int
	}{
		{"no endpoints", datapath.ClusterIP, false, false, nil, setNoEndpoints, 0},
		{"internal Local, endpoints elsewhere", datapath.ClusterIP, false, true, nil, setNoEndpoints, 0},
		{"external Local, no endpoints anywhere", datapath.LoadBalancer, true, false, nil, setNoEndpoints, 0},
		{"external Local, endpoints elsewhere", datapath.LoadBalancer, true, true, remote, setNoEndpointsLo, 1},
	} {
		f := datapath.Frontend{Service: datapath.ServicePortName{Namespace: "a", Name: "s", Port: "http"}, Kind: c.kind, Protocol: datapath.TCP, Addr: netip.MustParseAddr("10.96.0.9"),
			Family: datapath.IPv4, Port: 80, LocalOnly: c.localOnly, Drop: c.drop, Cluster: c.cluster}
		d, err := compute(config{}, &datapath.Plan{Frontends: []datapath.Frontend{f}})
		if err != nil {
			t.Fatal(err)
		}
		e := ipset.Entry{Addr: f.Addr, Protocol: f.Protocol, Port: f.Port}
		for _, set := range []string{setNoEndpoints, setNoEndpointsLo} {
			if got := slices.Contains(d.Entries[set], e); got != (set == c.want) {
				t.Errorf("%s: in %s: %t", c.name, set, got)
			}
		}
		for _, s := range d.Servers {
			if len(s.Reals) != c.reals {
				t.Errorf("%s: %d real servers, want %d", c.name, len(s.Reals), c.reals)
			}
		}
	}
}

// TestLoadBalancerSourceRangesAllowFromNode: a source range holding a
// node address lets the node reach the load balancer address (source:
// that address), as kube-proxy's allowFromNode; otherwise it may not.
func TestLoadBalancerSourceRangesAllowFromNode(t *testing.T) {
	lbIP := netip.MustParseAddr("203.0.113.5")
	for _, c := range []struct {
		ranges string
		want   bool
	}{{"192.168.1.0/24", true}, {"198.51.100.0/24", false}} {
		plan := &datapath.Plan{Frontends: []datapath.Frontend{{Service: datapath.ServicePortName{Namespace: "a", Name: "lb", Port: "http"}, Kind: datapath.LoadBalancer, Protocol: datapath.TCP,
			Addr: lbIP, Family: datapath.IPv4, Port: 443, SourceRanges: []netip.Prefix{netip.MustParsePrefix(c.ranges)}}}}
		d, err := compute(config{NodeAddresses: []netip.Addr{netip.MustParseAddr("192.168.1.10")}}, plan)
		if err != nil {
			t.Fatal(err)
		}
		self := ipset.Entry{Addr: lbIP, Protocol: datapath.TCP, Port: 443, Net: netip.PrefixFrom(lbIP, 32)}
		if got := slices.Contains(d.Entries[setLBSource], self); got != c.want {
			t.Errorf("ranges %s: node allowed = %v, want %v (entries %v)", c.ranges, got, c.want, d.Entries[setLBSource])
		}
	}
}

func TestComputeLeavesOutWhatItCannotProgram(t *testing.T) {
	plan := &datapath.Plan{Frontends: []datapath.Frontend{
		{Service: datapath.ServicePortName{Namespace: "a", Name: "v6", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: netip.MustParseAddr("fd00::1"), Family: datapath.IPv6, Port: 80},
		{Service: datapath.ServicePortName{Namespace: "a", Name: "bad", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: netip.MustParseAddr("10.96.0.7"), Family: datapath.IPv4, Port: 80, Scheduler: "sh", SchedulerFlags: []string{"sh-bogus"}},
		{Service: datapath.ServicePortName{Namespace: "a", Name: "ok", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: netip.MustParseAddr("10.96.0.8"), Family: datapath.IPv4, Port: 80},
	}}
	d, err := compute(config{}, plan) // IPv6 off
	if err == nil || !strings.Contains(err.Error(), "IPv6") || !strings.Contains(err.Error(), "sh-bogus") {
		t.Errorf("err = %v, want both problems named", err)
	}
	ports, rest := datapath.SplitPortErrors(err)
	if rest != nil || len(ports) != 2 || ports[0].Service != (datapath.ServicePortName{Namespace: "a", Name: "v6", Port: "http"}) || ports[1].Service != (datapath.ServicePortName{Namespace: "a", Name: "bad", Port: "http"}) {
		t.Errorf("port errors = %v, rest = %v; want one PortError each for a/v6 and a/bad", ports, rest)
	}
	if len(d.Servers) != 1 {
		t.Errorf("servers = %v, want only a/ok", d.Servers)
	}
	if v := d.Servers[Key{netip.MustParseAddr("10.96.0.8"), datapath.TCP, 80}]; v == nil || v.VS.Scheduler != "rr" {
		t.Errorf("default scheduler: %v, want rr", v)
	}
}

// rulesText is renderRules(c), which must not fail.
func rulesText(t *testing.T, c ruleConfig) string {
	t.Helper()
	text, err := renderRules(c)
	if err != nil {
		t.Fatal(err)
	}
	return text
}

// TestRules pins the static rules; their text is a
// function of the configuration alone, which is what keeps their number
// constant however many services there are.
func TestRules(t *testing.T) {
	v4, v6 := datapath.IPv4, datapath.IPv6
	golden(t, "rules.golden", rulesText(t, ruleConfig{Family: v4, MarkBit: 14}))
	cidr := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/56")}
	golden(t, "rules-cidr.golden", rulesText(t, ruleConfig{Family: v4, MarkBit: 14, ClusterCIDRs: cidr}))
	golden(t, "rules6-cidr.golden", rulesText(t, ruleConfig{Family: v6, MarkBit: 14, ClusterCIDRs: cidr}))
	// detectLocalMode BridgeInterface and InterfaceNamePrefix.
	golden(t, "rules-bridge.golden", rulesText(t, ruleConfig{Family: v4, MarkBit: 14, ClusterCIDRs: cidr, PodInterface: "cni0"}))
	golden(t, "rules6-prefix.golden", rulesText(t, ruleConfig{Family: v6, MarkBit: 14, PodInterface: "veth+"}))
	if rf := rulesText(t, ruleConfig{Family: v4, MarkBit: 14, RandomFully: true}); !strings.Contains(rf, "-j MASQUERADE --random-fully\n") {
		t.Errorf("RandomFully without --random-fully:\n%s", rf)
	}
	if all := rulesText(t, ruleConfig{Family: v4, MarkBit: 14, ClusterCIDRs: cidr, MasqueradeAll: true}); strings.Contains(all, "CLUSTER-MASQ -s 10.244.0.0/16") {
		t.Errorf("masqueradeAll still exempts the cluster range:\n%s", all)
	}
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := "testdata/" + name
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs (run with -update if intended):\n--- got\n%s--- want\n%s", path, got, want)
	}
}

// BenchmarkCompute measures the pure part of a sync: 1000 services × 10
// endpoints into virtual servers, addresses and set entries.
func BenchmarkCompute(b *testing.B) {
	plan := &datapath.Plan{}
	for i := range 1000 {
		f := datapath.Frontend{Service: datapath.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("s%d", i), Port: "p"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP,
			Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Family: datapath.IPv4, Port: 80}
		for e := range 10 {
			f.Endpoints = append(f.Endpoints, datapath.Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}), uint16(8000+e)), Weight: 1})
		}
		plan.Frontends = append(plan.Frontends, f)
	}
	for b.Loop() {
		if _, err := compute(config{}, plan); err != nil {
			b.Fatal(err)
		}
	}
}

func TestKernelNamesFit(t *testing.T) {
	for _, s := range allSets() {
		if len(s.Name) > ipset.MaxNameLen {
			t.Errorf("set %s: %d characters, the kernel takes %d", s.Name, len(s.Name), ipset.MaxNameLen)
		}
	}
	for _, c := range append(append([]string{}, natChains...), filterChains...) {
		if len(c) > 28 {
			t.Errorf("chain %s: %d characters, iptables takes 28", c, len(c))
		}
	}
}

// On a kernel without IPVS (the development host), New says so in a way
// the agent can test for.
func TestNewWithoutIPVS(t *testing.T) {
	if _, err := os.Stat("/proc/net/ip_vs"); err == nil {
		t.Skip("this kernel has IPVS")
	}
	if os.Geteuid() == 0 {
		if _, err := os.Stat("/lib/modules"); err == nil {
			// modprobe may load ip_vs from a matching module tree; only
			// assert when it cannot.
			if out, err := exec.Command("modprobe", "-n", "ip_vs").CombinedOutput(); err == nil {
				t.Skipf("ip_vs is loadable here: %s", out)
			}
		}
	}
	_, err := New(Options{})
	if !errors.Is(err, ErrNoIPVS) {
		t.Errorf("New on a kernel without IPVS: %v, want ErrNoIPVS", err)
	}
}

func TestConnReuseWorkaround(t *testing.T) {
	for release, want := range map[string]bool{
		"3.10.0-1160.el7.x86_64": false, // the sysctl does not exist yet
		"4.1.0":                  true,
		"4.19.0-27-amd64":        true,
		"5.4.0-150-generic":      true,
		"5.8.18":                 true,
		"5.9.0":                  false, // fixed: the kernel's default is kept
		"5.10.0-30-amd64":        false,
		"6.1.0-56-amd64":         false,
		"10.0":                   false,
		"garbage":                false,
	} {
		if got := connReuseWorkaround(release); got != want {
			t.Errorf("connReuseWorkaround(%q) = %v, want %v", release, got, want)
		}
	}
}

// NodePorts are served on the node addresses nodePortAddresses selects,
// per family; a family nothing restricts keeps every address, as
// kube-proxy's --nodeport-addresses (primary included).
func TestNodePortAddrs(t *testing.T) {
	a, p := netip.MustParseAddr, netip.MustParsePrefix
	all := []netip.Addr{a("192.168.77.1"), a("10.0.0.7"), a("fd00:77::1"), a("fd00:88::1")}
	both := []datapath.Family{datapath.IPv4, datapath.IPv6}
	for _, tc := range []struct {
		name    string
		cidrs   []netip.Prefix
		primary bool
		nodeIPs []netip.Addr
		want    []netip.Addr
	}{
		{"nothing set", nil, false, nil, all},
		{"an IPv4 CIDR leaves IPv6 alone", []netip.Prefix{p("192.168.77.0/24")}, false, nil, []netip.Addr{a("192.168.77.1"), a("fd00:77::1"), a("fd00:88::1")}},
		{"primary", nil, true, []netip.Addr{a("10.0.0.7"), a("fd00:88::1")}, []netip.Addr{a("10.0.0.7"), a("fd00:88::1")}},
		{"primary not known yet", nil, true, nil, all},
		{"no address in the range", []netip.Prefix{p("172.16.0.0/12")}, false, nil, []netip.Addr{a("fd00:77::1"), a("fd00:88::1")}},
	} {
		if got := nodePortAddrs(all, both, tc.cidrs, tc.primary, tc.nodeIPs); !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}
