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

// TableName is the name of edgeproxy's main table in each family (ip and
// ip6). Its Services' dispatch maps and chains are spread over Shards
// service tables besides it, ShardPrefix and the shard's number
// ("edgeproxy-svc-0" … "edgeproxy-svc-15"): a one-Service change then
// makes the kernel validate one small table instead of all of them (see
// RATIONALE.md). Every table of ours is named TableName or starts with
// ShardPrefix (Ours); Cleanup removes exactly those.
const TableName = "edgeproxy"

// ShardPrefix starts the name of each service table.
const ShardPrefix = TableName + "-svc-"

// Shards is the number of service tables per family (at most 254: a
// table's number is a uint8, 0 the main one). At 10k Services
// the kernel's validation of one change, once per table it touched,
// falls from 54–64 ms (one table) to about 1/K of it; each shard adds a
// dispatch lookup to the first packet of a connection that is no
// Service's (RATIONALE.md).
const Shards = 16

// Ours reports whether a table named name is one of edgeproxy's: the
// main table or a service table (any number, so that a table left by a
// build with another Shards is still found and removed).
func Ours(name string) bool {
	return name == TableName || strings.HasPrefix(name, ShardPrefix)
}

// tabName is the name of table tab: 0 the main table, i+1 shard i.
func tabName(tab uint8) string {
	if tab == 0 {
		return TableName
	}
	return ShardPrefix + strconv.Itoa(int(tab)-1)
}

// ServiceTable is the name of the service table that holds the Service
// namespace/name (its dispatch elements and chains, every port and
// family), for operators' tools and tests.
func ServiceTable(namespace, name string) string {
	return tabName(shardOf(datapath.ServicePortName{Namespace: namespace, Name: name}, Shards))
}

// shardCount is the number of service tables (Shards, unless a test
// set another).
func (o *Options) shardCount() int {
	if o.shards > 0 {
		return o.shards
	}
	return Shards
}

// shardOf is the table (1..k) of the Service namespace/name: FNV-1a of
// "namespace/name" mod k, so every port and family of a Service lands in
// the same table (its ext- chains jump to its svc- chains, and a jump
// cannot leave its table) and a Service stays where it is across
// restarts and builds.
func shardOf(s datapath.ServicePortName, k int) uint8 {
	h := uint32(2166136261)
	for _, b := range []byte(s.Namespace + "/" + s.Name) {
		h ^= uint32(b)
		h *= 16777619
	}
	return uint8(h%uint32(k)) + 1
}

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

// inShard: the sets every service table has (the dispatch maps, which
// point at its chains, and the node-port addresses its node-port rule
// matches); the main table has all others, and the node-port addresses
// too (its no-endpoint check).
func (s setSpec) inShard() bool {
	return s.name == mapServiceIPs || s.name == mapNodePorts || s.name == setNodePortIPs
}

// inMain: the sets the main table has.
func (s setSpec) inMain() bool { return s.name != mapServiceIPs && s.name != mapNodePorts }

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
	tab    uint8 // the table: 0 the main one, i+1 shard i
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

// fixedChains are the chains of the main table and of each of the k
// service tables, regular ones first (base chains jump to them, so they
// must exist before).
//
// restricted: node ports answer on the addresses in @nodeport-ips
// (nodePortAddresses) instead of every local address.
func (f *fam) fixedChains(o *Options, restricted bool) []chainSpec {
	k := o.shardCount()
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
	out := []chainSpec{
		{name: chainReject, rules: []rule{ruleReject(f)}},
		{name: chainSvcCheck, rules: []rule{ruleDispatch(f, true, mapNoEndpoints)}},
		{name: chainNodePortCheck, rules: []rule{ruleNodePortDispatch(f, restricted, mapNoEPPorts)}},
		{name: chainClusterIPs, rules: []rule{ruleAddrReject(f, setClusterIPs)}},
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
		{name: chainNatPost, typ: nftables.ChainTypeNAT, hook: nftables.ChainHookPostrouting, prio: prioSrcNAT, rules: []rule{ruleJump(false, chainMasquerading)}},
	}
	// Each service table: its dispatch, reached from its own nat hooks.
	// The first DNAT of a connection wins (nf_nat stops at the first
	// chain that bound it), so the tables' order at one priority does
	// not matter: a frontend is in one table's maps only.
	regular, base := []chainSpec{}, []chainSpec{}
	for i := 1; i <= k; i++ {
		tab := uint8(i)
		regular = append(regular, chainSpec{tab: tab, name: chainServices, rules: []rule{
			ruleDispatch(f, true, mapServiceIPs),
			ruleNodePortDispatch(f, restricted, mapNodePorts),
		}})
		base = append(base,
			chainSpec{tab: tab, name: chainNatPre, typ: nftables.ChainTypeNAT, hook: nftables.ChainHookPrerouting, prio: prioDstNAT, rules: []rule{ruleJump(false, chainServices)}},
			chainSpec{tab: tab, name: chainNatOutput, typ: nftables.ChainTypeNAT, hook: nftables.ChainHookOutput, prio: prioDstNAT, rules: []rule{ruleJump(false, chainServices)}})
	}
	return append(append(regular, out...), base...)
}
