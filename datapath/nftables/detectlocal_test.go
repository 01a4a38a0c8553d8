package nftables

import (
	"bytes"
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables/expr"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

var discard = slog.New(slog.DiscardHandler)

// detectModes are the ways to tell pods (kube-proxy's --detect-local-mode)
// as the agent sets them, with the Node's pod ranges of NodeCIDR.
var detectModes = []struct {
	name     string
	o        Options
	podCIDRs []netip.Prefix
	// What tells pods in each family's rules, as nft prints it.
	v4, v6 string
}{
	{"clustercidr", Options{ClusterCIDRs: []netip.Prefix{clusterCIDR, clusterCIDR6}}, nil, "ip saddr 10.244.0.0/16", "ip6 saddr fd00:244::/64"},
	{"nodecidr", Options{NodePodCIDRs: true, ClusterCIDRs: []netip.Prefix{clusterCIDR}},
		[]netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("10.244.9.0/24"), netip.MustParsePrefix("fd00:244:0:1::/64")},
		"ip saddr 10.244.1.0/24", "ip6 saddr fd00:244:0:1::/64"},
	{"bridge", Options{PodInterface: "cni0", ClusterCIDRs: []netip.Prefix{clusterCIDR}}, nil, `iifname "cni0"`, `iifname "cni0"`},
	{"prefix", Options{PodInterface: "veth+", ClusterCIDRs: []netip.Prefix{clusterCIDR}}, nil, `iifname "veth*"`, `iifname "veth*"`},
}

// detectPlan is a ClusterIP and a NodePort with traffic policy Local in
// each family.
func detectPlan(podCIDRs []netip.Prefix) *datapath.Plan {
	s4, s6 := svcName("default", "web", ""), svcName("default", "web6", "")
	all := []datapath.Endpoint{ep("10.244.1.2:8080", 1), ep("10.244.2.3:8080", 1)}
	all6 := []datapath.Endpoint{ep("[fd00:244:0:1::2]:8080", 1), ep("[fd00:244:0:2::3]:8080", 1)}
	np := nodePort(s4, datapath.TCP, datapath.IPv4, 30080, all[0])
	np.LocalOnly, np.Cluster = true, all
	np6 := nodePort(s6, datapath.TCP, datapath.IPv6, 30080, all6[0])
	np6.LocalOnly, np6.Cluster = true, all6
	p := newPlan(1, clusterIP(s4, datapath.TCP, "10.96.0.10", 80, all...), np,
		clusterIP(s6, datapath.TCP, "fd00:96::10", 80, all6...), np6)
	p.PodCIDRs = podCIDRs
	return p
}

// Each detect-local mode tells pods where kube-proxy's nftables mode
// does: traffic to a cluster IP from anything else is masqueraded, and a
// Local external frontend short-circuits pods to the cluster-wide
// endpoints; the interface modes match iifname (a prefix as "veth*"), in
// both families. NodeCIDR takes the first range of each family of the
// Node's; without one, no traffic is told from pods.
func TestDetectLocalRules(t *testing.T) {
	for _, m := range detectModes {
		t.Run(m.name, func(t *testing.T) {
			o := m.o
			o.MasqueradeBit = 14
			if o.NodePodCIDRs {
				o.followPodCIDRs(m.podCIDRs, discard)
			}
			plan := detectPlan(m.podCIDRs)
			for _, tc := range []struct {
				f     *fam
				vip   string
				match string
			}{{famIPv4, "ip daddr 10.96.0.10", m.v4}, {famIPv6, "ip6 daddr fd00:96::10", m.v6}} {
				var text string
				for _, fs := range group(plan, tc.f.family, true) {
					u, err := buildUnit(tc.f, &o, fs)
					if err != nil {
						t.Fatal(err)
					}
					text += u.String()
				}
				not := strings.Replace(strings.Replace(tc.match, "saddr ", "saddr != ", 1), "iifname ", "iifname != ", 1)
				for _, want := range []string{
					tc.vip + " " + not + " meta mark set meta mark | 0x00004000",
					tc.match + " goto svc-",
				} {
					if !strings.Contains(text, want) {
						t.Errorf("%s rules lack %q:\n%s", tc.f.name, want, text)
					}
				}
			}
		})
	}
	t.Run("nodecidr without a range", func(t *testing.T) {
		o := Options{MasqueradeBit: 14, NodePodCIDRs: true, ClusterCIDRs: []netip.Prefix{clusterCIDR}}
		o.followPodCIDRs(nil, discard)
		var text string
		for _, fs := range group(detectPlan(nil), datapath.IPv4, true) {
			u, err := buildUnit(famIPv4, &o, fs)
			if err != nil {
				t.Fatal(err)
			}
			text += u.String()
		}
		if strings.Contains(text, "ip saddr") || strings.Contains(text, "ip daddr 10.96.0.10 ") {
			t.Errorf("no pod range, yet pods are told (clusterCIDR must not stand in for it):\n%s", text)
		}
	})
}

// The iifname match is nft's: a name compared whole, zero-padded to
// IFNAMSIZ; a prefix compared on its own bytes. A name longer than an
// interface name can be is refused.
func TestPodInterfaceExprs(t *testing.T) {
	for _, tc := range []struct {
		m    podMatch
		data []byte
	}{
		{podMatch{iface: "cni0"}, append([]byte("cni0"), make([]byte, 12)...)},
		{podMatch{iface: "veth*"}, []byte("veth")},
	} {
		ex, _ := matchPods(famIPv4, true, tc.m)
		cmp, ok := ex[len(ex)-1].(*expr.Cmp)
		if meta, mok := ex[0].(*expr.Meta); !mok || meta.Key != expr.MetaKeyIIFNAME || !ok || cmp.Op != expr.CmpOpNeq || !bytes.Equal(cmp.Data, tc.data) {
			t.Errorf("%q: %#v, want meta iifname and cmp != %q", tc.m.iface, ex, tc.data)
		}
	}
	for _, bad := range []string{"a-name-too-long0", "a-prefix-too-lon+", "+"} {
		if _, err := New(Options{PodInterface: bad, NoConntrack: true}); err == nil {
			t.Errorf("pod interface %q accepted", bad)
		}
	}
}

// Each mode's ruleset, written over netlink, is what Debian's nft lists
// (testdata/detectlocal-MODE.golden), loads back from its text and its
// JSON, and every rule's text is the line nft prints for it.
func TestDetectLocalGolden(t *testing.T) {
	kernel(t)
	for _, m := range detectModes[1:] {
		t.Run(m.name, func(t *testing.T) {
			ns := netns.New(t, "nftdl")
			o := m.o
			o.IPv6 = true
			p := newProxier(t, ns, o)
			plan := detectPlan(m.podCIDRs)
			if err := p.Apply(context.Background(), plan); err != nil {
				t.Fatal(err)
			}
			got := roundTrip(t, ns, "detectlocal-"+m.name+".golden")
			for _, line := range []string{m.v4, m.v6} {
				if !strings.Contains(got, line) {
					t.Errorf("the ruleset lacks %q", line)
				}
			}
			for _, tb := range p.tables {
				for _, fs := range group(plan, tb.f.family, true) {
					u, err := buildUnit(tb.f, &p.opts, fs)
					if err != nil {
						t.Fatal(err)
					}
					for _, c := range u.chains {
						var lines, texts []string
						for _, l := range strings.Split(list(t, ns, "chain", tb.f.name, tabName(c.tab), c.name), "\n") {
							l = strings.TrimSpace(l)
							if l != "" && l != "}" && !strings.HasPrefix(l, "table ") && !strings.HasPrefix(l, "chain ") {
								lines = append(lines, l)
							}
						}
						for _, r := range c.rules {
							texts = append(texts, r.text)
						}
						if !slices.Equal(lines, texts) {
							t.Errorf("%s chain %s: nft prints\n%s\nthe rules' texts are\n%s", tb.f.name, c.name, strings.Join(lines, "\n"), strings.Join(texts, "\n"))
						}
					}
				}
			}
		})
	}
}

// NodeCIDR follows the Node: a plan with other pod ranges rewrites the
// tables, even when no Service changed.
func TestNodePodCIDRsFollowPlan(t *testing.T) {
	kernel(t)
	ns := netns.New(t, "nftdlnode")
	p := newProxier(t, ns, Options{NodePodCIDRs: true})
	plan := detectPlan([]netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")})
	if err := p.Apply(context.Background(), plan); err != nil {
		t.Fatal(err)
	}
	if got := listOurs(t, ns, "ip"); !strings.Contains(got, "ip saddr != 10.244.1.0/24") {
		t.Fatalf("the Node's range is not in the rules:\n%s", got)
	}
	quiet := detectPlan([]netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")})
	quiet.Generation, quiet.Full = 2, false
	if err := p.Apply(context.Background(), quiet); err != nil {
		t.Fatal(err)
	}
	if st := p.LastStats(); st.Rebuilt {
		t.Fatalf("the same range rewrote the tables: %+v", st)
	}
	moved := detectPlan([]netip.Prefix{netip.MustParsePrefix("10.244.7.0/24")})
	moved.Generation, moved.Full = 3, false
	if err := p.Apply(context.Background(), moved); err != nil {
		t.Fatal(err)
	}
	got := listOurs(t, ns, "ip")
	if st := p.LastStats(); !st.Rebuilt || !strings.Contains(got, "ip saddr != 10.244.7.0/24") || strings.Contains(got, "10.244.1.0/24") {
		t.Fatalf("after the Node's range moved (stats %+v):\n%s", st, got)
	}
}

// masqueradeAll masquerades every source to a cluster IP, pods too,
// however pods are told (kube-proxy: the mark rule has no source match).
func TestMasqueradeAllRules(t *testing.T) {
	for _, m := range detectModes {
		o := m.o
		o.MasqueradeBit, o.MasqueradeAll = 14, true
		if o.NodePodCIDRs {
			o.followPodCIDRs(m.podCIDRs, discard)
		}
		u, err := buildUnit(famIPv4, &o, group(detectPlan(m.podCIDRs), datapath.IPv4, true)[svcName("default", "web", "")])
		if err != nil {
			t.Fatal(err)
		}
		if want := "ip daddr 10.96.0.10 meta mark set meta mark | 0x00004000\n"; !strings.Contains(u.String(), want) {
			t.Errorf("%s: the cluster IP's rules lack %q:\n%s", m.name, want, u)
		}
	}
}
