// The fixed part of the rules: the chains that exist whatever the plan,
// their static rules, and the jumps from the built-in chains.

package iptables

import (
	"net/netip"
	"slices"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// nodePortDst returns the destination matches that select node-port
// addresses, one rule each.
func nodePortDst(cfg *Config) [][]xtables.Match {
	if cfg.NodePortIPs == nil {
		switch {
		case cfg.Family == datapath.IPv6:
			return [][]xtables.Match{{xtables.DstLocal(), xtables.NotDst(netip.MustParsePrefix("::1/128"))}}
		case !cfg.LocalhostNodePorts:
			return [][]xtables.Match{{xtables.DstLocal(), xtables.NotDst(loopback4)}}
		}
		return [][]xtables.Match{{xtables.DstLocal()}}
	}
	var out [][]xtables.Match
	for _, a := range cfg.NodePortIPs {
		if datapath.FamilyOf(a) != cfg.Family || a.IsLoopback() && (cfg.Family == datapath.IPv6 || !cfg.LocalhostNodePorts) {
			continue
		}
		out = append(out, []xtables.Match{xtables.DstHost(a.Unmap())})
	}
	return out
}

var loopback4 = netip.MustParsePrefix("127.0.0.0/8")

// fixedChains lists the chains that exist regardless of the plan, per table.
var fixedChains = map[string][]string{
	xtables.NAT:    {chainServices, chainNodePorts, chainPostrouting, chainHairpin, chainMarkMasq, chainClusterMasq, chainCanary},
	xtables.Filter: {chainServices, chainExternal, chainFirewall, chainForward, chainLocalnet, chainNodePorts, chainCanary},
}

// canaryRule is the single rule of the canary chains. A flush of the table
// removes it; Tampered looks for it.
var canaryRule = xtables.Rule{Comment: "edgeproxy canary", Target: xtables.Return}

// staticRules returns the fixed chains' rules that do not depend on the
// plan: head rules come before the units' rules, tail rules after.
func staticRules(cfg *Config) (head, tail []topRule) {
	mark := cfg.markMasq()
	head = []topRule{
		{xtables.NAT, chainMarkMasq, xtables.Rule{Target: xtables.MarkOr(mark)}},
		{xtables.NAT, chainPostrouting, xtables.Rule{Matches: []xtables.Match{xtables.CtState("DNAT")}, Target: xtables.JumpTo(chainHairpin)}},
		{xtables.NAT, chainPostrouting, xtables.Rule{Matches: []xtables.Match{xtables.NotMark(mark)}, Target: xtables.Return}},
		{xtables.NAT, chainPostrouting, xtables.Rule{Target: xtables.MarkXor(mark)}},
		{xtables.NAT, chainPostrouting, xtables.Rule{Comment: "edgeproxy service traffic requiring SNAT", Target: xtables.Masquerade(cfg.RandomFully)}},
		{xtables.NAT, chainCanary, canaryRule},
		{xtables.Filter, chainForward, xtables.Rule{Matches: []xtables.Match{xtables.Mark(mark)}, Comment: "edgeproxy forwarding rules", Target: xtables.Accept}},
		{xtables.Filter, chainForward, xtables.Rule{Matches: []xtables.Match{xtables.CtState("RELATED,ESTABLISHED")}, Comment: "edgeproxy forwarding conntrack rule", Target: xtables.Accept}},
		{xtables.Filter, chainCanary, canaryRule},
	}
	if !cfg.TCPBeLiberal {
		// Out-of-window packets would reset connections; with
		// tcp_be_liberal the kernel takes them instead (kube-proxy).
		head = slices.Insert(head, 0, topRule{xtables.Filter, chainForward,
			xtables.Rule{Matches: []xtables.Match{xtables.CtState("INVALID")}, Comment: "edgeproxy: out-of-window packets must not reset connections", Target: xtables.Drop}})
	}
	if cfg.Family == datapath.IPv4 && cfg.LocalhostNodePorts {
		// route_localnet lets packets to 127.0.0.0/8 arrive from outside
		// (CVE-2020-8558); only those DNATed to a NodePort may pass, like
		// kube-proxy's (and kubelet's) KUBE-FIREWALL rule.
		head = append(head, topRule{xtables.Filter, chainLocalnet,
			xtables.Rule{Matches: []xtables.Match{xtables.Dst(loopback4), xtables.NotSrc(loopback4), xtables.NotCtState("RELATED,ESTABLISHED,DNAT")}, Comment: "edgeproxy: block incoming localnet connections", Target: xtables.Drop}})
	}
	for _, p := range cfg.HealthCheckPorts {
		head = append(head, topRule{xtables.Filter, chainNodePorts,
			xtables.Rule{Matches: []xtables.Match{xtables.DPort("tcp", p)}, Comment: "edgeproxy health check node port", Target: xtables.Accept}})
	}
	if pods, ok := cfg.fromPods(); ok {
		head = append(head, topRule{xtables.NAT, chainClusterMasq, xtables.Rule{Matches: []xtables.Match{pods}, Target: xtables.Return}})
	}
	head = append(head, topRule{xtables.NAT, chainClusterMasq, xtables.Rule{Target: xtables.JumpTo(chainMarkMasq)}})
	for _, d := range nodePortDst(cfg) {
		tail = append(tail, topRule{xtables.NAT, chainServices, xtables.Rule{Matches: d, Comment: "edgeproxy node ports; keep last", Target: xtables.JumpTo(chainNodePorts)}})
	}
	return head, tail
}

// jumps is the static skeleton: where packets enter our chains, in the
// order they stand at the top of each built-in chain. IPv6 has no
// localnet martians to drop (no route_localnet); in IPv4 they are dropped
// first, as kube-proxy's KUBE-FIREWALL is: a neighbour's packet to
// 127.0.0.1 must meet no other rule (a no-endpoints NodePort's reject
// would answer it).
func jumps(fam datapath.Family) []xtables.Jump {
	newOnly := []xtables.Match{xtables.CtState("NEW")}
	j := func(table, from string, cond []xtables.Match, to, why string) xtables.Jump {
		return xtables.Jump{Table: table, Chain: from, Rule: xtables.Rule{Matches: cond, Comment: "edgeproxy " + why, Target: xtables.JumpTo(to)}}
	}
	var out []xtables.Jump
	if fam == datapath.IPv4 {
		out = append(out,
			j(xtables.Filter, "INPUT", nil, chainLocalnet, "localnet martians"),
			j(xtables.Filter, "OUTPUT", nil, chainLocalnet, "localnet martians"))
	}
	out = append(out, []xtables.Jump{
		j(xtables.NAT, "PREROUTING", nil, chainServices, "service portals"),
		j(xtables.NAT, "OUTPUT", nil, chainServices, "service portals"),
		j(xtables.NAT, "POSTROUTING", nil, chainPostrouting, "postrouting rules"),
		j(xtables.Filter, "INPUT", newOnly, chainServices, "service portals"),
		j(xtables.Filter, "INPUT", newOnly, chainExternal, "node ports"),
		j(xtables.Filter, "INPUT", newOnly, chainFirewall, "load balancer firewall"),
		j(xtables.Filter, "FORWARD", newOnly, chainServices, "service portals"),
		j(xtables.Filter, "FORWARD", newOnly, chainExternal, "external service portals"),
		j(xtables.Filter, "FORWARD", newOnly, chainFirewall, "load balancer firewall"),
		j(xtables.Filter, "FORWARD", nil, chainForward, "forwarding rules"),
		j(xtables.Filter, "OUTPUT", newOnly, chainServices, "service portals"),
		j(xtables.Filter, "OUTPUT", newOnly, chainFirewall, "load balancer firewall"),
		j(xtables.Filter, "INPUT", nil, chainNodePorts, "health check node ports"),
	}...)
	return out
}

// obsoleteJumps are jumps earlier versions wrote and this one does not:
// removed on the first apply and by cleanup, so that they neither linger
// nor keep our chains busy.
func obsoleteJumps() []xtables.Jump {
	return []xtables.Jump{{Table: xtables.Filter, Chain: "OUTPUT", Rule: xtables.Rule{Matches: []xtables.Match{xtables.CtState("NEW")}, Comment: "edgeproxy node ports", Target: xtables.JumpTo(chainExternal)}}}
}
