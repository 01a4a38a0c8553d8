// The fixed part of the rules: the chains that exist whatever the plan,
// their static rules, and the jumps from the built-in chains.

package iptables

import (
	"net/netip"
	"slices"

	"github.com/edgeproxy/edgeproxy/datapath"
)

// nodePortDst returns the destination matches that select node-port
// addresses, one rule each.
func nodePortDst(cfg *Config) [][]match {
	if cfg.NodePortIPs == nil {
		switch {
		case cfg.Family == datapath.IPv6:
			return [][]match{{dstLocal(), dstNotIn(netip.MustParsePrefix("::1/128"))}}
		case !cfg.LocalhostNodePorts:
			return [][]match{{dstLocal(), dstNotIn(loopback4)}}
		}
		return [][]match{{dstLocal()}}
	}
	var out [][]match
	for _, a := range cfg.NodePortIPs {
		if datapath.FamilyOf(a) != cfg.Family || a.IsLoopback() && (cfg.Family == datapath.IPv6 || !cfg.LocalhostNodePorts) {
			continue
		}
		out = append(out, []match{dstHost(a.Unmap())})
	}
	return out
}

var loopback4 = netip.MustParsePrefix("127.0.0.0/8")

// fixedChains lists the chains that exist regardless of the plan, per table.
var fixedChains = map[string][]string{
	tableNAT:    {chainServices, chainNodePorts, chainPostrouting, chainHairpin, chainMarkMasq, chainClusterMasq, chainCanary},
	tableFilter: {chainServices, chainExternal, chainFirewall, chainForward, chainLocalnet, chainNodePorts, chainCanary},
}

// canaryRule is the single rule of the canary chains. A flush of the table
// removes it; Tampered looks for it.
var canaryRule = rule{comment: "edgeproxy canary", target: verdict(tReturn)}

// staticRules returns the fixed chains' rules that do not depend on the
// plan: head rules come before the units' rules, tail rules after.
func staticRules(cfg *Config) (head, tail []topRule) {
	mark := cfg.markMasq()
	head = []topRule{
		{tableNAT, chainMarkMasq, rule{target: markOr(mark)}},
		{tableNAT, chainPostrouting, rule{matches: []match{ctState("DNAT")}, target: jumpTo(chainHairpin)}},
		{tableNAT, chainPostrouting, rule{matches: []match{markNotSet(mark)}, target: verdict(tReturn)}},
		{tableNAT, chainPostrouting, rule{target: markXor(mark)}},
		{tableNAT, chainPostrouting, rule{comment: "edgeproxy service traffic requiring SNAT", target: masquerade(cfg.RandomFully)}},
		{tableNAT, chainCanary, canaryRule},
		{tableFilter, chainForward, rule{[]match{markSet(mark)}, "edgeproxy forwarding rules", verdict(tAccept)}},
		{tableFilter, chainForward, rule{[]match{ctState("RELATED,ESTABLISHED")}, "edgeproxy forwarding conntrack rule", verdict(tAccept)}},
		{tableFilter, chainCanary, canaryRule},
	}
	if !cfg.TCPBeLiberal {
		// Out-of-window packets would reset connections; with
		// tcp_be_liberal the kernel takes them instead (kube-proxy).
		head = slices.Insert(head, 0, topRule{tableFilter, chainForward,
			rule{[]match{ctState("INVALID")}, "edgeproxy: out-of-window packets must not reset connections", verdict(tDrop)}})
	}
	if cfg.Family == datapath.IPv4 && cfg.LocalhostNodePorts {
		// route_localnet lets packets to 127.0.0.0/8 arrive from outside
		// (CVE-2020-8558); only those DNATed to a NodePort may pass, like
		// kube-proxy's (and kubelet's) KUBE-FIREWALL rule.
		head = append(head, topRule{tableFilter, chainLocalnet,
			rule{[]match{dstIn(loopback4), srcNotIn(loopback4), ctStateNot("RELATED,ESTABLISHED,DNAT")}, "edgeproxy: block incoming localnet connections", verdict(tDrop)}})
	}
	for _, p := range cfg.HealthCheckPorts {
		head = append(head, topRule{tableFilter, chainNodePorts,
			rule{[]match{dport("tcp", p)}, "edgeproxy health check node port", verdict(tAccept)}})
	}
	for _, c := range cfg.ClusterCIDRs {
		head = append(head, topRule{tableNAT, chainClusterMasq, rule{matches: []match{srcIn(c.Masked())}, target: verdict(tReturn)}})
	}
	head = append(head, topRule{tableNAT, chainClusterMasq, rule{target: jumpTo(chainMarkMasq)}})
	for _, d := range nodePortDst(cfg) {
		tail = append(tail, topRule{tableNAT, chainServices, rule{d, "edgeproxy node ports; keep last", jumpTo(chainNodePorts)}})
	}
	return head, tail
}

// jumps is the static skeleton: where packets enter our chains. IPv6 has
// no localnet martians to drop (no route_localnet).
func jumps(fam datapath.Family) []jump {
	newOnly := []match{ctState("NEW")}
	j := func(table, from string, cond []match, to, why string) jump {
		return jump{table, from, rule{cond, "edgeproxy " + why, jumpTo(to)}}
	}
	out := []jump{
		j(tableNAT, "PREROUTING", nil, chainServices, "service portals"),
		j(tableNAT, "OUTPUT", nil, chainServices, "service portals"),
		j(tableNAT, "POSTROUTING", nil, chainPostrouting, "postrouting rules"),
		j(tableFilter, "INPUT", newOnly, chainServices, "service portals"),
		j(tableFilter, "INPUT", newOnly, chainExternal, "node ports"),
		j(tableFilter, "INPUT", newOnly, chainFirewall, "load balancer firewall"),
		j(tableFilter, "FORWARD", newOnly, chainServices, "service portals"),
		j(tableFilter, "FORWARD", newOnly, chainExternal, "external service portals"),
		j(tableFilter, "FORWARD", newOnly, chainFirewall, "load balancer firewall"),
		j(tableFilter, "FORWARD", nil, chainForward, "forwarding rules"),
		j(tableFilter, "OUTPUT", newOnly, chainServices, "service portals"),
		j(tableFilter, "OUTPUT", newOnly, chainFirewall, "load balancer firewall"),
		j(tableFilter, "INPUT", nil, chainNodePorts, "health check node ports"),
	}
	if fam == datapath.IPv4 {
		out = append(out,
			j(tableFilter, "INPUT", nil, chainLocalnet, "localnet martians"),
			j(tableFilter, "OUTPUT", nil, chainLocalnet, "localnet martians"))
	}
	return out
}

// obsoleteJumps are jumps earlier versions wrote and this one does not:
// removed on the first apply and by cleanup, so that they neither linger
// nor keep our chains busy.
func obsoleteJumps() []jump {
	return []jump{{tableFilter, "OUTPUT", rule{[]match{ctState("NEW")}, "edgeproxy node ports", jumpTo(chainExternal)}}}
}
