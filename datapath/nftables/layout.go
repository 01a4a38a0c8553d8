package nftables

import (
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/edgeproxy/edgeproxy/datapath"
)

// TableName is the name of edgeproxy's table in each family (ip and ip6).
// Cleanup removes exactly these tables.
const TableName = "edgeproxy"

// Fixed objects of each table. These maps and sets are the only sets but
// the affinity sets of endpoints of Services with session affinity
// (affinitySetName): their number does not grow with the number of
// Services (the measurements: the number of sets, not nftables,
// is the cost).
const (
	mapServiceIPs    = "service-ips"           // daddr . proto . dport : goto svc-/ext- chain
	mapNodePorts     = "service-nodeports"     // proto . dport : goto ext- chain (local daddr)
	mapNoEndpoints   = "no-endpoint-services"  // daddr . proto . dport : goto reject-chain | drop
	mapNoEPPorts     = "no-endpoint-nodeports" // proto . dport : goto reject-chain | drop
	setHairpin       = "hairpin"               // ep . ep: an endpoint reaching itself
	setNodePortIPs   = "nodeport-ips"          // daddr: node-port addresses (nodePortAddresses)
	setFirewallIPs   = "firewall-ips"          // daddr . proto . dport: LB frontends with source ranges
	setFirewallAllow = "firewall-allow"        // daddr . proto . dport . saddr (interval): who may reach them
	setClusterIPs    = "cluster-ips"           // daddr: every cluster IP (its other ports are rejected)

	chainFilterPre     = "filter-prerouting-pre-dnat"
	chainFilterOutPre  = "filter-output-pre-dnat"
	chainFilterInput   = "filter-input"
	chainFilterForward = "filter-forward"
	chainFilterOutput  = "filter-output"
	chainSvcCheck      = "service-endpoints-check"
	chainNodePortCheck = "nodeport-endpoints-check"
	chainClusterIPs    = "cluster-ips-check"
	chainReject        = "reject-chain"
	chainNatPre        = "nat-prerouting"
	chainNatOutput     = "nat-output"
	chainNatPost       = "nat-postrouting"
	chainServices      = "services"
	chainMasquerading  = "masquerading"
)

// Priorities as kube-proxy's nftables mode: the firewall chains at
// dstnat - 10 in prerouting and output, before DNAT (they look at the load
// balancer's address); the no-endpoint checks in input, forward and output
// at filter, after DNAT, so that they see only traffic that was not
// translated (a Service without endpoints, by its own address) and the
// short-circuited traffic of a Local Service passes; the nat chains at
// dstnat and srcnat.
const (
	prioPreDNAT = nftables.ChainPriority(-110)
	prioFilter  = nftables.ChainPriority(0)
	prioDstNAT  = nftables.ChainPriority(-100)
	prioSrcNAT  = nftables.ChainPriority(100)
	svcPrefix   = "svc-"
	extPrefix   = "ext-"
	maxChainLen = 256 // NFT_CHAIN_MAXNAMELEN
)

// fam is what differs between the ip and ip6 tables.
type fam struct {
	family      datapath.Family
	tf          nftables.TableFamily
	nfproto     uint32 // NFPROTO_* for the nat expression
	name        string // "ip" or "ip6": nft's word for the header
	addrLen     uint32
	saddrOff    uint32
	daddrOff    uint32
	addrType    nftables.SetDatatype
	loopback    netip.Prefix
	portUnreach uint8 // ICMP(v6) port unreachable, what reject sends
}

var (
	famIPv4 = &fam{family: datapath.IPv4, tf: nftables.TableFamilyIPv4, nfproto: unix.NFPROTO_IPV4, name: "ip",
		addrLen: 4, saddrOff: 12, daddrOff: 16, addrType: nftables.TypeIPAddr,
		loopback: netip.MustParsePrefix("127.0.0.0/8"), portUnreach: 3}
	famIPv6 = &fam{family: datapath.IPv6, tf: nftables.TableFamilyIPv6, nfproto: unix.NFPROTO_IPV6, name: "ip6",
		addrLen: 16, saddrOff: 8, daddrOff: 24, addrType: nftables.TypeIP6Addr,
		loopback: netip.MustParsePrefix("::1/128"), portUnreach: 4}
)

// chainName is the chain of one service port: "svc-" or "ext-" and
// "namespace/name/port" ("namespace/name" for an unnamed port). nft's
// identifiers allow '/' but not ':'. Kubernetes names (namespace and name
// at most 63 bytes, a port name at most 15) keep it far below nf_tables'
// 256 bytes, so a name is never shortened and never collides.
func chainName(prefix string, s datapath.ServicePortName) string {
	n := prefix + s.Namespace + "/" + s.Name
	if s.Port != "" {
		n += "/" + s.Port
	}
	return n
}

// setSpec is one of the fixed maps (of verdicts) or sets.
type setSpec struct {
	name     string
	key      []nftables.SetDatatype
	isMap    bool
	interval bool
}

// affinitySetName names the set of the clients that stick to endpoint
// ep of service port s (session affinity, as kube-proxy's nftables mode:
// a set of client addresses per endpoint; see RATIONALE.md): "aff-NS/NAME[/PORT]/ADDR/PORT", the
// address's colons written as '-' (nft's identifiers allow letters,
// digits, '/', '-', '_' and '.', not ':'). Kubernetes names keep it under
// nf_tables' 256 bytes; the last two fields are read from the right, so
// names never collide.
func affinitySetName(s datapath.ServicePortName, ep netip.AddrPort) string {
	return "aff-" + chainName("", s) + "/" + strings.ReplaceAll(ep.Addr().String(), ":", "-") + "/" + strconv.Itoa(int(ep.Port()))
}

// affinitySetSize bounds each per-endpoint affinity set. When it is
// full, new clients get no affinity: the cascade falls through to its
// last rule, which has no update.
const affinitySetSize = 1 << 16

func (f *fam) sets() []setSpec {
	return []setSpec{
		{mapServiceIPs, []nftables.SetDatatype{f.addrType, nftables.TypeInetProto, nftables.TypeInetService}, true, false},
		{mapNodePorts, []nftables.SetDatatype{nftables.TypeInetProto, nftables.TypeInetService}, true, false},
		{mapNoEndpoints, []nftables.SetDatatype{f.addrType, nftables.TypeInetProto, nftables.TypeInetService}, true, false},
		{mapNoEPPorts, []nftables.SetDatatype{nftables.TypeInetProto, nftables.TypeInetService}, true, false},
		{setHairpin, []nftables.SetDatatype{f.addrType, f.addrType}, false, false},
		{setNodePortIPs, []nftables.SetDatatype{f.addrType}, false, false},
		{setFirewallIPs, []nftables.SetDatatype{f.addrType, nftables.TypeInetProto, nftables.TypeInetService}, false, false},
		{setFirewallAllow, []nftables.SetDatatype{f.addrType, nftables.TypeInetProto, nftables.TypeInetService, f.addrType}, false, true},
		{setClusterIPs, []nftables.SetDatatype{f.addrType}, false, false},
	}
}

// chainSpec is a chain and its rules; base chains have a hook.
type chainSpec struct {
	name   string
	typ    nftables.ChainType
	hook   *nftables.ChainHook
	prio   nftables.ChainPriority
	rules  []rule
	digest [16]byte // of the rules' texts (Service chains; see seal)

	// While buildUnit collects a load-balancing chain: its endpoints, the
	// cluster IPs' masquerade rules that go before them, and the session
	// affinity timeout of the frontends that use it.
	eps      []datapath.Endpoint
	marks    []rule
	affinity time.Duration
}

// fixedChains are the chains every table has, regular ones first (base
// chains jump to them, so they must exist before).
//
// restricted: node ports answer on the addresses in @nodeport-ips
// (nodePortAddresses) instead of every local address.
func (f *fam) fixedChains(o *Options, restricted bool) []chainSpec {
	bit := uint32(1) << o.MasqueradeBit
	// Packets conntrack finds out of window (INVALID) are dropped rather
	// than forwarded un-NATed to a pod that would reset the connection,
	// as kube-proxy does, unless the node's conntrack is liberal.
	//
	// A new connection to a cluster IP that no DNAT translated (a port no
	// Service has; the ports without endpoints are refused before) is
	// rejected, as kube-proxy's nftables mode does, rather than routed
	// out of the node.
	forward := []rule{ruleJump(true, chainSvcCheck), ruleJump(true, chainClusterIPs)}
	if !o.TCPBeLiberal {
		forward = append([]rule{ruleInvalidDrop()}, forward...)
	}
	return []chainSpec{
		{name: chainReject, rules: []rule{ruleReject(f)}},
		{name: chainSvcCheck, rules: []rule{ruleDispatch(f, true, mapNoEndpoints)}},
		{name: chainNodePortCheck, rules: []rule{ruleNodePortDispatch(f, restricted, mapNoEPPorts)}},
		{name: chainClusterIPs, rules: []rule{ruleAddrReject(f, setClusterIPs)}},
		{name: chainServices, rules: []rule{
			ruleDispatch(f, true, mapServiceIPs),
			ruleNodePortDispatch(f, restricted, mapNodePorts),
		}},
		{name: chainMasquerading, rules: []rule{
			ruleHairpinMark(f, setHairpin, bit),
			ruleUnmarkedReturn(bit),
			ruleClearMark(bit),
			ruleMasquerade(),
		}},
		{name: chainFilterPre, typ: nftables.ChainTypeFilter, hook: nftables.ChainHookPrerouting, prio: prioPreDNAT, rules: []rule{
			ruleFirewall(f, setFirewallIPs, setFirewallAllow),
		}},
		{name: chainFilterOutPre, typ: nftables.ChainTypeFilter, hook: nftables.ChainHookOutput, prio: prioPreDNAT, rules: []rule{
			ruleFirewall(f, setFirewallIPs, setFirewallAllow),
		}},
		{name: chainFilterInput, typ: nftables.ChainTypeFilter, hook: nftables.ChainHookInput, prio: prioFilter, rules: []rule{
			ruleJump(true, chainNodePortCheck),
			ruleJump(true, chainSvcCheck),
		}},
		{name: chainFilterForward, typ: nftables.ChainTypeFilter, hook: nftables.ChainHookForward, prio: prioFilter, rules: forward},
		{name: chainFilterOutput, typ: nftables.ChainTypeFilter, hook: nftables.ChainHookOutput, prio: prioFilter, rules: []rule{
			ruleJump(true, chainSvcCheck),
			ruleJump(true, chainClusterIPs),
		}},
		{name: chainNatPre, typ: nftables.ChainTypeNAT, hook: nftables.ChainHookPrerouting, prio: prioDstNAT, rules: []rule{ruleJump(false, chainServices)}},
		{name: chainNatOutput, typ: nftables.ChainTypeNAT, hook: nftables.ChainHookOutput, prio: prioDstNAT, rules: []rule{ruleJump(false, chainServices)}},
		{name: chainNatPost, typ: nftables.ChainTypeNAT, hook: nftables.ChainHookPostrouting, prio: prioSrcNAT, rules: []rule{ruleJump(false, chainMasquerading)}},
	}
}
