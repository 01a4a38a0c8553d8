package ipvs

import (
	"context"
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
// flushed chain and a deleted jump are repaired; remove leaves nothing.
func TestRulesOnFake(t *testing.T) {
	ctx := context.Background()
	cidr := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/56")}
	for name, c := range map[string]ruleConfig{
		"v4":                 {Family: datapath.IPv4, MarkBit: 14},
		"v4 cidr":            {Family: datapath.IPv4, MarkBit: 14, ClusterCIDRs: cidr, RandomFully: true},
		"v4 masqueradeAll":   {Family: datapath.IPv4, MarkBit: 14, ClusterCIDRs: cidr, MasqueradeAll: true},
		"v6 cidr":            {Family: datapath.IPv6, MarkBit: 14, ClusterCIDRs: cidr},
		"v4 another markbit": {Family: datapath.IPv4, MarkBit: 3},
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
			if err := ipt.remove(ctx); err != nil {
				t.Fatal(err)
			}
			if d := k.Dump(); d != "" {
				t.Errorf("after remove:\n%s", d)
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
