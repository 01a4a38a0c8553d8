package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"strings"

	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// Prefix starts the name of every chain edgeproxy creates. Cleanup and the
// stale-chain sweep only ever touch chains that carry it.
const Prefix = "EP-"

// MaxChainLen is the longest chain name iptables accepts.
const MaxChainLen = xtables.MaxChainLen

// Fixed chains. Each lives in the table named next to it; the jumps to them
// from the built-in chains are listed in jumps.
const (
	chainServices    = "EP-SERVICES"     // nat: DNAT dispatch; filter: reject/drop for no endpoints
	chainNodePorts   = "EP-NODEPORTS"    // nat: NodePort dispatch, reached for local destinations; filter: accept health check ports
	chainPostrouting = "EP-POSTROUTING"  // nat: masquerade marked packets
	chainMarkMasq    = "EP-MARK-MASQ"    // nat: set the masquerade bit
	chainClusterMasq = "EP-CLUSTER-MASQ" // nat: mark sources outside the cluster CIDRs
	chainExternal    = "EP-EXTERNAL"     // filter: reject/drop external frontends without endpoints
	chainFirewall    = "EP-FIREWALL"     // filter: loadBalancerSourceRanges
	chainForward     = "EP-FORWARD"      // filter: drop INVALID, accept marked and established
	chainCanary      = "EP-CANARY"       // nat+filter: holds one rule; its loss means a flush
	chainHairpin     = "EP-HAIRPIN"      // nat: masquerade endpoints reaching themselves
	chainLocalnet    = "EP-LOCALNET"     // filter: drop martians to 127.0.0.0/8 (route_localnet)
)

// Kinds of per-service chains.
const (
	kindSvc = "SVC" // load balancing over the endpoints of one group
	kindSep = "SEP" // one endpoint of a service with affinity: record the client, DNAT
	kindExt = "EXT" // external entry: masquerade or the Local policy short-circuits
	kindFw  = "FW"  // filter: source ranges of one LoadBalancer frontend
)

// ChainName returns the chain name for a per-service object: Prefix, kind,
// a dash and 16 base32 characters of the SHA-256 of id. The result is at
// most MaxChainLen long for every kind of up to 4 characters, uses only
// [A-Z2-7-], and is stable across runs, so a restarted proxy finds the
// chains its predecessor wrote. 80 hash bits make collisions negligible
// (about 1e-14 for 100k chains).
func ChainName(kind, id string) string {
	sum := sha256.Sum256([]byte(id))
	enc := base32.StdEncoding.EncodeToString(sum[:])
	return Prefix + kind + "-" + enc[:16]
}

// IPVSPrefix starts the chains of IPVS mode (datapath/ipvs). They carry
// Prefix too, but belong to the other mode: iptables mode neither sweeps
// nor cleans them (IPVS mode's cleanup does, with its jumps, which would
// otherwise keep them busy).
const IPVSPrefix = Prefix + "IPVS-"

// ours reports whether a chain name was made by iptables mode.
func ours(chain string) bool {
	return strings.HasPrefix(chain, Prefix) && !strings.HasPrefix(chain, IPVSPrefix)
}
