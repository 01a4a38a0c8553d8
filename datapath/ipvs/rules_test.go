package ipvs

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// TestRulesOnFake: ensure writes the chains and the jumps into empty
// tables (an xtables.Fake, which parses every rule into the typed model
// as iptables-restore would refuse what it cannot parse); a second
// ensure changes nothing; countRules finds what Tampered expects; a
// flushed chain and a deleted jump are repaired; remove leaves nothing of
// ours (a jump inserted twice included) and what is not ours.
func TestRulesOnFake(t *testing.T) {
	ctx := context.Background()
	cidr := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/56")}
	for name, c := range map[string]ruleConfig{
		"v4":                 {Family: datapath.IPv4, MarkBit: 14},
		"v4 cidr":            {Family: datapath.IPv4, MarkBit: 14, ClusterCIDRs: cidr, RandomFully: true},
		"v4 masqueradeAll":   {Family: datapath.IPv4, MarkBit: 14, ClusterCIDRs: cidr, MasqueradeAll: true},
		"v6 cidr":            {Family: datapath.IPv6, MarkBit: 14, ClusterCIDRs: cidr},
		"v4 another markbit": {Family: datapath.IPv4, MarkBit: 3},
		"v4 bridge":          {Family: datapath.IPv4, MarkBit: 14, ClusterCIDRs: cidr, PodInterface: "cni0"},
		"v6 prefix":          {Family: datapath.IPv6, MarkBit: 14, PodInterface: "veth+"},
	} {
		t.Run(name, func(t *testing.T) {
			k := xtables.NewFake()
			ipt := iptables{x: k, fam: c.Family}
			text := rulesText(t, c)
			if err := ipt.ensure(ctx, text); err != nil {
				t.Fatal(err)
			}
			want := k.Dump()
			if n, err := ipt.countRules(ctx); err != nil || n != ruleCount(text)+len(jumps()) {
				t.Errorf("countRules = %d, %v; want %d", n, err, ruleCount(text)+len(jumps()))
			}
			if err := ipt.ensure(ctx, text); err != nil || k.Dump() != want {
				t.Errorf("a second ensure (%v) changed the tables:\n%s\nwant:\n%s", err, k.Dump(), want)
			}
			// The only jump in nat PREROUTING: ensure inserts a missing
			// jump first in its chain, so in a chain with two the order
			// after a repair may differ from a fresh start's.
			j := jumps()[0]
			for _, args := range [][]string{{"-t", "filter", "-F", chainFilter}, append([]string{"-t", j.Table, "-D", j.Chain}, j.Rule.Args()...)} {
				if _, err := k.Run(ctx, args...); err != nil {
					t.Fatal(err)
				}
			}
			if k.Dump() == want {
				t.Fatal("the edits changed nothing")
			}
			if err := ipt.ensure(ctx, text); err != nil || k.Dump() != want {
				t.Errorf("ensure (%v) did not repair the edits:\n%s", err, k.Dump())
			}
			// A jump inserted twice goes twice; a rule not ours stays.
			foreign := []string{"-t", "nat", "-I", "PREROUTING", "1", "-s", "192.0.2.0/24", "-j", "ACCEPT"}
			if c.Family == datapath.IPv6 {
				foreign[6] = "2001:db8::/32"
			}
			for _, args := range [][]string{append([]string{"-t", j.Table, "-I", j.Chain, "1"}, j.Rule.Args()...), foreign} {
				if _, err := k.Run(ctx, args...); err != nil {
					t.Fatal(err)
				}
			}
			only := xtables.NewFake()
			if _, err := only.Run(ctx, foreign...); err != nil {
				t.Fatal(err)
			}
			if err := ipt.remove(ctx); err != nil {
				t.Fatal(err)
			}
			if d := k.Dump(); d != only.Dump() {
				t.Errorf("after remove:\n%s\nwant:\n%s", d, only.Dump())
			}
			if err := ipt.remove(ctx); err != nil || k.Dump() != only.Dump() {
				t.Errorf("a second remove: %v\n%s", err, k.Dump())
			}
			if !strings.Contains(want, "-A INPUT -m conntrack --ctstate NEW -m comment --comment \"edgeproxy-ipvs host filter\" -j EP-IPVS-HOST-FILTER\n") {
				t.Errorf("no host filter jump in:\n%s", want)
			}
		})
	}
}

// TestRulesWithoutTool: with no tool opened (a fake Kernel), every call
// fails instead of panicking.
func TestRulesWithoutTool(t *testing.T) {
	var ipt iptables
	if err := ipt.ensure(context.Background(), ""); err == nil {
		t.Error("ensure succeeded")
	}
	if _, err := ipt.countRules(context.Background()); err == nil {
		t.Error("countRules succeeded")
	}
	if err := ipt.remove(context.Background()); err != nil {
		t.Errorf("remove: %v (nothing there is fine)", err)
	}
}

// inSets rewrites restore text for a packet that is in exactly the sets
// in ("NAME dirs", as the rules match them): a set match the packet
// passes is taken out of its rule, and a rule with a set match it fails
// is left out. The xtables tracer holds no ipset contents; this lets it
// walk the static rules for one packet.
func inSets(text string, in ...string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		for _, s := range in {
			l = strings.ReplaceAll(l, "-m set --match-set "+s+" ", "")
			if strings.Contains(l, "-m set ! --match-set "+s+" ") {
				l = "" // never matches
			}
		}
		for strings.Contains(l, "-m set ! --match-set ") {
			// Not in that set: the negated match passes.
			i := strings.Index(l, "-m set ! --match-set ")
			rest := strings.SplitN(l[i:], " ", 7) // -m set ! --match-set NAME DIRS rest
			l = l[:i] + rest[6]
		}
		if strings.Contains(l, "--match-set") {
			continue // in none of its sets: never matches
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

// TestPacketFlowsDetectLocal: kube-proxy's local-traffic detection
// modes in IPVS mode's static rules, traced: a packet to a ClusterIP
// (in EP-CLUSTER-IP) is masqueraded unless it comes from a pod as the
// mode tells pods (its source range, the bridge, an interface prefix);
// a packet to a Local load balancer without local endpoints (in
// EP-NO-ENDPOINTS-LOCAL) is dropped unless it comes from a pod. IPVS's
// own DNAT is not traced: the rules' verdict and mark are.
func TestPacketFlowsDetectLocal(t *testing.T) {
	ctx := context.Background()
	node := netip.MustParseAddr("192.168.1.10")
	node6 := netip.MustParseAddr("fd00:1::10")
	cidr := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/56")}
	type flow struct {
		src, iface string
		masq       bool   // to the ClusterIP: masqueraded
		lb         string // to the Local load balancer without local endpoints: ACCEPT or DROP
	}
	for _, c := range []struct {
		name  string
		cfg   ruleConfig
		flows []flow
	}{
		{"ClusterCIDR", ruleConfig{Family: datapath.IPv4, ClusterCIDRs: cidr}, []flow{
			{"10.244.0.9", "veth1", false, "ACCEPT"},
			{"10.244.1.5", "eth0", false, "ACCEPT"},
			{"203.0.113.5", "eth0", true, "DROP"},
		}},
		// NodeCIDR is the Node's range in ClusterCIDRs (Proxier.followPodCIDRs).
		{"NodeCIDR", ruleConfig{Family: datapath.IPv4, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24")}}, []flow{
			{"10.244.0.9", "veth1", false, "ACCEPT"},
			{"10.244.1.5", "eth0", true, "DROP"},
		}},
		{"BridgeInterface", ruleConfig{Family: datapath.IPv4, ClusterCIDRs: cidr, PodInterface: "cni0"}, []flow{
			{"10.244.0.9", "cni0", false, "ACCEPT"},
			{"172.16.0.9", "cni0", false, "ACCEPT"},
			{"10.244.0.9", "eth0", true, "DROP"},
		}},
		{"InterfaceNamePrefix", ruleConfig{Family: datapath.IPv4, PodInterface: "veth+"}, []flow{
			{"10.244.0.9", "veth9", false, "ACCEPT"},
			{"10.244.0.9", "cni0", true, "DROP"},
			{"203.0.113.5", "eth0", true, "DROP"},
		}},
		// Nothing tells pods: only the node's own traffic from a service
		// address would be masqueraded, and nobody short-circuits.
		{"nothing tells pods", ruleConfig{Family: datapath.IPv4}, []flow{
			{"10.244.0.9", "veth1", false, "DROP"},
			{"203.0.113.5", "eth0", false, "DROP"},
		}},
		{"InterfaceNamePrefix IPv6", ruleConfig{Family: datapath.IPv6, PodInterface: "veth+"}, []flow{
			{"fd00:10:244::9", "veth9", false, "ACCEPT"},
			{"2001:db8::5", "eth0", true, "DROP"},
		}},
		{"NodeCIDR IPv6", ruleConfig{Family: datapath.IPv6, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:10:244::/64")}}, []flow{
			{"fd00:10:244::9", "veth9", false, "ACCEPT"},
			{"fd00:10:244:1::9", "eth0", true, "DROP"},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.cfg.MarkBit = 14
			vip, lb, local := netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("172.30.0.100"), node
			if c.cfg.Family == datapath.IPv6 {
				vip, lb, local = netip.MustParseAddr("fd00:96::10"), netip.MustParseAddr("fd00:30::100"), node6
			}
			text := rulesText(t, c.cfg)
			for _, fl := range c.flows {
				for _, to := range []struct {
					dst netip.Addr
					set string
				}{{vip, setName(setClusterIP, c.cfg.Family)}, {lb, setName(setNoEndpointsLo, c.cfg.Family)}} {
					k := xtables.NewFake()
					if err := (iptables{x: k, fam: c.cfg.Family}).ensure(ctx, inSets(text, to.set+" dst,dst")); err != nil {
						t.Fatal(err)
					}
					// The address is bound on the dummy link, but the
					// packet IPVS rewrites goes on as forwarded: trace it so.
					paths, err := k.Trace(xtables.Packet{Src: netip.MustParseAddr(fl.src), Dst: to.dst, Proto: "tcp", Port: 80, InIface: fl.iface}, []netip.Addr{local})
					if err != nil || len(paths) != 1 {
						t.Fatalf("trace: %v, %v", paths, err)
					}
					if p := paths[0]; to.dst == vip && (p.Verdict != xtables.Accepted || p.Masquerade != fl.masq) {
						t.Errorf("%s on %s to the ClusterIP: %s, masquerade %v; want masquerade %v", fl.src, fl.iface, p.Verdict, p.Masquerade, fl.masq)
					} else if to.dst == lb && string(p.Verdict) != fl.lb {
						t.Errorf("%s on %s to a Local LB without local endpoints: %s, want %s", fl.src, fl.iface, p.Verdict, fl.lb)
					}
				}
			}
		})
	}
}

// TestNodeCIDRFollowsTheNode: with NodePodCIDRs the static rules tell
// pods by the Node's pod ranges of the last plan, and a change of them
// has the rules written again at the next Apply.
func TestNodeCIDRFollowsTheNode(t *testing.T) {
	p := &Proxier{opts: Options{NodePodCIDRs: true, IPv6: true, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, MasqueradeBit: 14},
		log: slog.New(slog.DiscardHandler)}
	v4, v6 := iptables{fam: datapath.IPv4}, iptables{fam: datapath.IPv6}
	masqRule := func(ipt iptables) string {
		text, err := p.ruleText(ipt)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(text, "\n") {
			if strings.HasPrefix(l, "-A "+chainClusterMasq+" -s ") {
				return l
			}
		}
		return ""
	}
	p.rulesOK = true
	p.followPodCIDRs(nil)
	if p.rulesOK {
		t.Error("the first look at the Node's ranges does not have the rules written")
	}
	if r := masqRule(v4); r != "" {
		t.Errorf("without the Node's ranges: %q, want no range (not clusterCIDR's)", r)
	}
	p.rulesOK = true
	p.followPodCIDRs([]netip.Prefix{netip.MustParsePrefix("10.244.3.0/24"), netip.MustParsePrefix("10.244.4.0/24"), netip.MustParsePrefix("fd00:244:3::/64")})
	if p.rulesOK {
		t.Error("new ranges do not have the rules written")
	}
	if r4, r6 := masqRule(v4), masqRule(v6); r4 != "-A EP-IPVS-CLUSTER-MASQ -s 10.244.3.0/24 -j RETURN" || r6 != "-A EP-IPVS-CLUSTER-MASQ -s fd00:244:3::/64 -j RETURN" {
		t.Errorf("with the Node's ranges: %q, %q; want the first of each family", r4, r6)
	}
	p.rulesOK = true
	p.followPodCIDRs([]netip.Prefix{netip.MustParsePrefix("10.244.3.0/24"), netip.MustParsePrefix("fd00:244:3::/64")})
	if !p.rulesOK {
		t.Error("the same ranges have the rules written again")
	}
}
