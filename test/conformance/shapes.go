// Package conformance is the differential conformance matrix: upstream
// kube-proxy is the oracle, edgeproxy in the same mode is judged against
// it — iptables mode on this machine (TestMatrix), IPVS mode in the qemu
// VM (TestMatrixIPVS). Both run, one at a time, in the same world — a real
// kube-apiserver with the EndpointSlice controller, a node namespace with
// local pods, a second node whose pods are reached by routes, and clients
// in four positions — and every cell (shape × frontend × position × family
// × backend) is probed with real packets. Outcomes must match, unless the
// cell is listed in DIFFERENCES.md (a deliberate difference) or
// KNOWN_BUGS.md (a divergence not fixed yet).
package conformance

import (
	"fmt"
	"net/netip"
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Profiles are proxy configurations: each runs the shapes that name it.
const (
	ProfileDefault = ""        // NodePorts on every node address
	ProfileNPA     = "npa"     // nodePortAddresses: the node's client link (IPv4 only)
	ProfilePrimary = "primary" // nodePortAddresses: [primary], the node's InternalIPs
	// The node without global IPv6 addresses (World.withoutIPv6) and
	// clusterCIDR IPv4 only: nothing tells of IPv6 but the kernel.
	ProfileNoIPv6 = "noipv6"
)

// Profiles lists the profiles the shapes name, the default first.
func Profiles() []string {
	out := []string{ProfileDefault}
	for _, s := range Shapes {
		if !slices.Contains(out, s.Profile) {
			out = append(out, s.Profile)
		}
	}
	return out
}

// Shape is one Service the matrix probes: its spec and which pods it
// selects. Adding a case is adding a line to Shapes.
type Shape struct {
	Name     string
	Type     corev1.ServiceType
	Proto    corev1.Protocol
	Families string // "dual" (PreferDualStack), "v4", "v6" (SingleStack)
	ETP, ITP string // "Local" or "" (Cluster)
	Pods     []string
	// Terminating pods are selected but being deleted (serving, not ready).
	Affinity bool // sessionAffinity ClientIP
	// AffinityTimeout (seconds, with Affinity): the expiry check instead
	// of plain probes (World.expiry), from the pod to the ClusterIP.
	AffinityTimeout int32
	ExternalIPs     bool // spec.externalIPs
	IPModeProxy     bool // LoadBalancer ingress ipMode Proxy (must not be programmed)
	// SourceRange is loadBalancerSourceRanges: SourceClient (only the
	// external client) or SourceNode (only the node's InternalIPs).
	SourceRange string
	Traffic     string // spec.trafficDistribution
	Profile     string
	// Change makes the shape a UDP conntrack check instead of plain
	// probes: established flows, the Service changed (Change*), the same
	// flows again (World.change).
	Change string
	// HostPort: instead of the Service's port, the node's own daemon's
	// (hostDaemonPort, on 0.0.0.0) through the ClusterIP and the LB IP.
	HostPort bool
	// Ports, when set, are the Service's ports (Proto is then unused):
	// each frontend is probed on each, and the cell's frontend part names
	// the port ("clusterip:dns-tcp"). Unset: one port, servicePort to
	// targetPort, protocol Proto, and frontends without a port name.
	Ports []Port
	// Namespace and Service are the Service's namespace and name when
	// they are not namespace and Name (Name stays the cell's key): very
	// long names, the same name in two namespaces.
	Namespace, Service string
	// ProxyHealth: instead of the Service, the proxy's own /healthz and
	// /livez (healthzPort on the node's InternalIP), in the state the
	// world is in while cells are probed (synced).
	ProxyHealth bool
}

// Source ranges of a shape (Shape.SourceRange).
const (
	SourceClient = "client" // the external client's addresses
	SourceNode   = "node"   // the node's InternalIPs
)

// ns is the namespace of the shape's Service (and of the Pod objects it
// selects).
func (s *Shape) ns() string {
	if s.Namespace != "" {
		return s.Namespace
	}
	return namespace
}

// svcName is the name of the shape's Service.
func (s *Shape) svcName() string {
	if s.Service != "" {
		return s.Service
	}
	return s.Name
}

// Port is one port of a Service with several.
type Port struct {
	Name  string // the Service port's name
	Proto corev1.Protocol
	Port  int32
	// Target is a container port's name (podPorts): each pod resolves it
	// to its own number. Empty: targetPort.
	Target string
}

// ports are the shape's Service ports.
func (s *Shape) ports() []Port {
	if len(s.Ports) > 0 {
		return s.Ports
	}
	return []Port{{Name: "p", Proto: s.Proto, Port: servicePort}}
}

// podPorts are the pods' named container ports (the Pod objects declare
// them, the pods' echo servers listen on them). "alt" resolves to a
// different number in each pod: a proxy that takes one endpoint's port
// for all of them reaches a port nobody listens on.
var podPorts = map[string][]corev1.ContainerPort{
	"l1": {{Name: "alt", ContainerPort: 8081, Protocol: tcp}, {Name: "dns", ContainerPort: 5353, Protocol: udp}, {Name: "dns-tcp", ContainerPort: 5353, Protocol: tcp}},
	"r1": {{Name: "alt", ContainerPort: 8082, Protocol: tcp}, {Name: "dns", ContainerPort: 5353, Protocol: udp}, {Name: "dns-tcp", ContainerPort: 5353, Protocol: tcp}},
}

// Changes a change shape makes to its Service between the two probes of
// its flows, each put back afterwards.
const (
	ChangeReplace = "replace" // its only endpoint sa is replaced by sb
	ChangeAdd     = "add"     // no endpoints, then sa
	ChangeRemove  = "remove"  // sa, then no endpoints
	ChangeDelete  = "delete"  // the Service is deleted
	ChangePort    = "port"    // its port changes to changedPort (the NodePort stays)
)

// changedPort is a ChangePort Service's port after the change.
const changedPort = 81

// Pods of the world: node-a (this node, zone-a) holds l1, l2, tl and the
// client pod cpod; node-b (zone-b) holds r1, r2, tr; node-c (zone-a) holds
// z1. node-b and node-c pods live in one namespace behind a route. tl and tr
// are terminating (and serving). sa and sb are the change shapes' pods
// (local). nr is not ready; tn is terminating and not serving (local).
// rc is the client pod on node-b (position rpod), selected by no Service.
// u1 lives there too but belongs to node-d, a Node without a zone.
var (
	localPods  = []string{"l1", "l2", "tl", "cpod", "sa", "sb", "nr", "tn"}
	remotePods = map[string]string{"r1": "node-b", "r2": "node-b", "tr": "node-b", "rc": "node-b", "u1": "node-d", "z1": "node-c"}
	terminal   = map[string]bool{"tl": true, "tr": true, "tn": true}
	notReady   = map[string]bool{"nr": true, "tn": true}
)

const (
	tcp = corev1.ProtocolTCP
	udp = corev1.ProtocolUDP
	cip = corev1.ServiceTypeClusterIP
	np  = corev1.ServiceTypeNodePort
	lb  = corev1.ServiceTypeLoadBalancer
)

// Shapes is the table of Services.
var Shapes = []Shape{
	{Name: "cip", Type: cip, Proto: tcp, Families: "dual", Pods: []string{"l1", "r1"}},
	{Name: "cip-v4only", Type: cip, Proto: tcp, Families: "v4", Pods: []string{"l1", "r1"}},
	{Name: "cip-v6only", Type: cip, Proto: tcp, Families: "v6", Pods: []string{"l1", "r1"}},
	{Name: "cip-udp", Type: cip, Proto: udp, Families: "dual", Pods: []string{"l1", "r1"}},
	{Name: "cip-itp-local", Type: cip, Proto: tcp, Families: "dual", ITP: "Local", Pods: []string{"l1", "r1"}},
	{Name: "cip-itp-local-remote-only", Type: cip, Proto: tcp, Families: "dual", ITP: "Local", Pods: []string{"r1"}},
	{Name: "cip-affinity", Type: cip, Proto: tcp, Families: "dual", Affinity: true, Pods: []string{"l1", "l2", "r1"}},
	{Name: "cip-no-endpoints", Type: cip, Proto: tcp, Families: "dual"},
	{Name: "cip-no-endpoints-udp", Type: cip, Proto: udp, Families: "dual"},
	{Name: "cip-terminating-only", Type: cip, Proto: tcp, Families: "dual", Pods: []string{"tl", "tr"}},
	{Name: "cip-remote-only", Type: cip, Proto: tcp, Families: "dual", Pods: []string{"r1", "r2"}},
	{Name: "cip-local-only", Type: cip, Proto: tcp, Families: "dual", Pods: []string{"l1", "l2"}},
	{Name: "cip-zone-mismatch", Type: cip, Proto: tcp, Families: "dual", Traffic: "PreferSameZone", Pods: []string{"r1", "r2"}},
	{Name: "cip-zone-match", Type: cip, Proto: tcp, Families: "dual", Traffic: "PreferSameZone", Pods: []string{"l1", "z1", "r1"}},
	{Name: "hairpin", Type: np, Proto: tcp, Families: "dual", Pods: []string{"cpod"}},
	{Name: "np", Type: np, Proto: tcp, Families: "dual", Pods: []string{"l1", "r1"}},
	{Name: "np-v4only", Type: np, Proto: tcp, Families: "v4", Pods: []string{"l1", "r1"}},
	{Name: "np-udp", Type: np, Proto: udp, Families: "dual", Pods: []string{"l1", "r1"}},
	{Name: "np-etp-local", Type: np, Proto: tcp, Families: "dual", ETP: "Local", Pods: []string{"l1", "r1"}},
	{Name: "np-etp-local-udp", Type: np, Proto: udp, Families: "dual", ETP: "Local", Pods: []string{"l1", "r1"}},
	{Name: "np-itp-local", Type: np, Proto: tcp, Families: "dual", ITP: "Local", Pods: []string{"l1", "r1"}},
	{Name: "np-etp-local-itp-local", Type: np, Proto: tcp, Families: "dual", ETP: "Local", ITP: "Local", Pods: []string{"l1", "r1"}},
	{Name: "np-etp-local-remote-only", Type: np, Proto: tcp, Families: "dual", ETP: "Local", Pods: []string{"r1"}},
	{Name: "np-etp-local-no-endpoints", Type: np, Proto: tcp, Families: "dual", ETP: "Local"},
	{Name: "np-no-endpoints", Type: np, Proto: tcp, Families: "dual"},
	{Name: "np-terminating-only", Type: np, Proto: tcp, Families: "dual", ETP: "Local", Pods: []string{"tl", "tr"}},
	{Name: "lb", Type: lb, Proto: tcp, Families: "dual", Pods: []string{"l1", "r1"}},
	{Name: "lb-udp", Type: lb, Proto: udp, Families: "dual", Pods: []string{"l1", "r1"}},
	{Name: "lb-etp-local", Type: lb, Proto: tcp, Families: "dual", ETP: "Local", Pods: []string{"l1", "r1"}},
	{Name: "lb-etp-local-remote-only", Type: lb, Proto: tcp, Families: "dual", ETP: "Local", Pods: []string{"r1"}},
	{Name: "lb-ipmode-proxy", Type: lb, Proto: tcp, Families: "dual", IPModeProxy: true, Pods: []string{"l1", "r1"}},
	{Name: "lb-source-ranges", Type: lb, Proto: tcp, Families: "dual", SourceRange: SourceClient, Pods: []string{"l1", "r1"}},
	{Name: "extip", Type: cip, Proto: tcp, Families: "dual", ExternalIPs: true, Pods: []string{"l1", "r1"}},
	{Name: "extip-etp-local", Type: cip, Proto: tcp, Families: "dual", ExternalIPs: true, ETP: "Local", Pods: []string{"l1", "r1"}},
	{Name: "udp-stale", Type: lb, Proto: udp, Families: "dual", ExternalIPs: true, Change: ChangeReplace, Pods: []string{"sa"}},
	{Name: "np-npa", Type: np, Proto: tcp, Families: "dual", Profile: ProfileNPA, Pods: []string{"l1", "r1"}},
	{Name: "np-primary", Type: np, Proto: tcp, Families: "dual", Profile: ProfilePrimary, Pods: []string{"l1", "r1"}},
	{Name: "hostport", Type: lb, Proto: tcp, Families: "dual", HostPort: true, Pods: []string{"l1", "r1"}},
	// Several ports, one a named target port that each pod resolves to
	// its own number (l1 8081, r1 8082).
	{Name: "np-multiport", Type: np, Families: "dual", Pods: []string{"l1", "r1"},
		Ports: []Port{{Name: "http", Proto: tcp, Port: 80}, {Name: "alt", Proto: tcp, Port: 81, Target: "alt"}}},
	// A DNS Service: 53/UDP and 53/TCP, named target ports.
	{Name: "dns", Type: cip, Families: "dual", Pods: []string{"l1", "r1"},
		Ports: []Port{{Name: "dns", Proto: udp, Port: 53, Target: "dns"}, {Name: "dns-tcp", Proto: tcp, Port: 53, Target: "dns-tcp"}}},
	// UDP conntrack in every direction (udp-stale above: the endpoint
	// replaced), through the ClusterIP, a NodePort, an LB IP, an externalIP.
	{Name: "udp-add", Type: lb, Proto: udp, Families: "dual", ExternalIPs: true, Change: ChangeAdd},
	{Name: "udp-remove", Type: lb, Proto: udp, Families: "dual", ExternalIPs: true, Change: ChangeRemove, Pods: []string{"sa"}},
	{Name: "udp-delete", Type: lb, Proto: udp, Families: "dual", ExternalIPs: true, Change: ChangeDelete, Pods: []string{"sa"}},
	{Name: "udp-port", Type: lb, Proto: udp, Families: "dual", ExternalIPs: true, Change: ChangePort, Pods: []string{"sa"}},
	// Endpoint conditions: ready and terminating mixed, terminating and
	// not serving, not ready; a health check whose only local endpoint
	// is terminating.
	{Name: "cip-ready-terminating", Type: cip, Proto: tcp, Families: "dual", Pods: []string{"l1", "tl", "r1", "tr"}},
	{Name: "np-etp-local-ready-terminating", Type: np, Proto: tcp, Families: "dual", ETP: "Local", Pods: []string{"l1", "tl", "r1"}},
	{Name: "cip-terminating-not-serving", Type: cip, Proto: tcp, Families: "dual", Pods: []string{"tn"}},
	{Name: "cip-not-ready", Type: cip, Proto: tcp, Families: "dual", Pods: []string{"l1", "nr"}},
	{Name: "lb-etp-local-terminating", Type: lb, Proto: tcp, Families: "dual", ETP: "Local", Pods: []string{"tl", "r1"}},
	// ClientIP affinity through NodePorts and LB IPs, and its timeout.
	{Name: "lb-affinity", Type: lb, Proto: tcp, Families: "dual", Affinity: true, Pods: []string{"l1", "l2", "r1"}},
	{Name: "cip-affinity-timeout", Type: cip, Proto: tcp, Families: "dual", Affinity: true, AffinityTimeout: affinityTimeout, Pods: []string{"l1", "l2", "r1"}},
	// Source ranges that hold the node's own addresses: the node's own
	// requests to the LB IP pass (kube-proxy's allowFromNode), an outside
	// client's do not.
	{Name: "lb-source-ranges-node", Type: lb, Proto: tcp, Families: "dual", SourceRange: SourceNode, Pods: []string{"l1", "r1"}},
	// trafficDistribution: PreferClose (PreferSameZone's older name) and
	// PreferSameNode (GA and locked on since 1.35), whose node hints
	// keep every client of this node on l1, outside ones included.
	{Name: "cip-prefer-close", Type: cip, Proto: tcp, Families: "dual", Traffic: "PreferClose", Pods: []string{"l1", "z1", "r1"}},
	// Slices without hints: u1's Node has no zone, so the controller
	// hints l1 and r1 only, and a proxy must then ignore the hints it
	// has (all endpoints, as without trafficDistribution).
	{Name: "cip-zone-unhinted", Type: cip, Proto: tcp, Families: "dual", Traffic: "PreferSameZone", Pods: []string{"l1", "u1", "r1"}},
	{Name: "np-prefer-same-node", Type: np, Proto: tcp, Families: "dual", Traffic: "PreferSameNode", Pods: []string{"l1", "r1"}},
	// Names at the API's limit (63 characters; chain names are hashed
	// from them), and one Service name in two namespaces, each with its
	// own endpoint: a proxy that keys by name alone mixes them up.
	{Name: "long-names", Namespace: longNamespace, Service: longService, Type: lb, Proto: tcp, Families: "dual", ETP: "Local", Pods: []string{"l1", "r1"}},
	{Name: "twin-a", Service: "twin", Type: np, Proto: tcp, Families: "dual", Pods: []string{"l1"}},
	{Name: "twin-b", Namespace: namespace + "-b", Service: "twin", Type: np, Proto: tcp, Families: "dual", Pods: []string{"r1"}},
	// A node with link-local IPv6 addresses only: kube-proxy proxies IPv6
	// whenever the kernel and ip6tables can (platformCheckSupported), so
	// its IPv6 ClusterIP answers all the same. From the pod only: the
	// node has no IPv6 source address of its own to send from.
	{Name: "cip-node-noipv6", Type: cip, Proto: tcp, Families: "dual", Profile: ProfileNoIPv6, Pods: []string{"l1", "l2"}},
	// The proxies' own /healthz and /livez.
	{Name: "proxy-health", Type: cip, Proto: tcp, Families: "dual", ProxyHealth: true, Pods: []string{"l1"}},
}

// The long names' namespace and Service name: 63 characters each, the
// most a DNS label (RFC 1123, RFC 1035) may have.
var (
	longNamespace = "conformance-" + strings.Repeat("n", 63-len("conformance-"))
	longService   = "long-" + strings.Repeat("s", 63-len("long-"))
)

// CellCount pins the number of cells per backend (all profiles): a shape
// or profile that stops producing cells, or a run that judges fewer,
// fails instead of shrinking the matrix.
var CellCount = map[string]int{"legacy": 1199, "nft": 1199, "nftables": 1194, "ipvs": 1194}

// Anchors are outcomes kube-proxy's column must show in this world, at
// least one for every shape on every backend (keys are cell patterns, as
// in DIFFERENCES.md): a broken world (a route, a pod, the controller's
// zone hints) would otherwise look the same under both proxies and pass.
// Each states what makes the shape what it is: the endpoints it must
// reach or not, the source they must see.
var Anchors = map[string]string{
	"cip/clusterip/pod/v4/*":           "l1,r1 from cpod",
	"cip/clusterip/pod/v6/*":           "l1,r1 from cpod",
	"cip-v4only/clusterip/pod/v4/*":    "l1,r1 from cpod",
	"cip-v6only/clusterip/pod/v6/*":    "l1,r1 from cpod",
	"cip-udp/clusterip/pod/v4/*":       "l1,r1 from cpod",
	"cip-udp/clusterip/pod/v6/*":       "l1,r1 from cpod",
	"cip-itp-local/clusterip/pod/v4/*": "l1 from cpod",
	// No local endpoint: iptables mode drops, IPVS mode's virtual server
	// has no real server and refuses.
	"cip-itp-local-remote-only/clusterip/pod/v4/legacy": "timeout",
	"cip-itp-local-remote-only/clusterip/pod/v4/nft":    "timeout",
	"cip-itp-local-remote-only/clusterip/pod/v4/ipvs":   "refused",
	"cip-affinity/clusterip/pod/v4/*":                   "one-sticky from cpod",
	"cip-affinity/clusterip/pod/v6/*":                   "one-sticky from cpod",
	"cip-no-endpoints/clusterip/pod/v4/*":               "refused",
	"cip-no-endpoints-udp/clusterip/pod/v4/*":           "refused",
	"cip-terminating-only/clusterip/pod/v4/*":           "tl,tr from cpod",
	"cip-remote-only/clusterip/pod/v4/*":                "r1,r2 from cpod",
	"cip-local-only/clusterip/pod/v4/*":                 "l1,l2 from cpod",
	// Zone hints: the same zone's endpoints only (l1 here, z1 on node-c
	// in zone-a), none of another zone's when some are hinted for ours,
	// all of them when none is.
	"cip-zone-match/clusterip/pod/v4/*":           "l1,z1 from cpod",
	"cip-zone-match/clusterip/pod/v6/*":           "l1,z1 from cpod",
	"cip-zone-mismatch/clusterip/pod/v4/*":        "r1,r2 from cpod",
	"hairpin/clusterip/pod/v4/*":                  "cpod from node/br",
	"np/np/ext/v4/*":                              "l1,r1 from node/br,node/remote-link",
	"np/np/ext/v6/*":                              "l1,r1 from node/br,node/remote-link",
	"np-v4only/np/ext/v4/*":                       "l1,r1 from node/br,node/remote-link",
	"np-v4only/np/ext/v6/*":                       "refused",
	"np-udp/np/ext/v4/*":                          "l1,r1 from node/br,node/remote-link",
	"np-etp-local/np/ext/v4/*":                    "l1 from ext",
	"np-etp-local/np/ext/v6/*":                    "l1 from ext",
	"np-etp-local-udp/np/ext/v4/*":                "l1 from ext",
	"np-itp-local/clusterip/pod/v4/*":             "l1 from cpod",
	"np-etp-local-itp-local/clusterip/pod/v4/*":   "l1 from cpod",
	"np-etp-local-itp-local/np/ext/v4/*":          "l1 from ext",
	"np-etp-local-remote-only/clusterip/pod/v4/*": "r1 from cpod",
	"np-etp-local-remote-only/np/ext/v4/legacy":   "timeout",
	"np-etp-local-remote-only/np/ext/v4/nft":      "timeout",
	"np-etp-local-remote-only/np/ext/v4/ipvs":     "r1 from ext",
	"np-etp-local-no-endpoints/np/ext/v4/*":       "refused",
	"np-no-endpoints/np/ext/v4/*":                 "refused",
	"np-terminating-only/np/ext/v4/*":             "tl from ext",
	"lb/lb/ext/v4/*":                              "l1,r1 from node/br,node/remote-link",
	"lb/lb/ext/v6/*":                              "l1,r1 from node/br,node/remote-link",
	"lb-udp/lb/ext/v4/*":                          "l1,r1 from node/br,node/remote-link",
	"lb-etp-local/lb/ext/v4/*":                    "l1 from ext",
	"lb-etp-local/hc/ext/v4/*":                    "http 200 local=1",
	"lb-etp-local/hc/ext/v6/*":                    "http 200 local=1",
	"lb-etp-local-remote-only/hc/ext/v4/*":        "http 503 local=0",
	"lb-etp-local-remote-only/lb/pod/v4/*":        "r1 from cpod",
	"lb-ipmode-proxy/clusterip/pod/v4/*":          "l1,r1 from cpod",
	"lb-ipmode-proxy/lb/ext/v4/*":                 "timeout",
	"lb-source-ranges/lb/ext/v4/*":                "l1,r1 from node/br,node/remote-link",
	"lb-source-ranges/lb/outpod/v4/*":             "timeout",
	"extip/extip/ext/v4/*":                        "l1,r1 from node/br,node/remote-link",
	"extip-etp-local/extip/ext/v4/*":              "l1 from ext",
	"udp-stale/clusterip/pod/v4/*":                "before sa, old flow after replace: sb",
	"udp-stale/np/ext/v6/*":                       "before sa, old flow after replace: sb",
	"np-npa/np/ext/v4/*":                          "l1,r1 from node/br,node/remote-link",
	"np-npa/np-other/pod/v4/*":                    "refused",
	"np-primary/np/ext/v4/*":                      "l1,r1 from node/br,node/remote-link",
	"np-primary/np-other/pod/v4/*":                "refused",
	"hostport/hostport-clusterip/pod/v4/legacy":   "timeout",
	"hostport/hostport-clusterip/pod/v4/nft":      "timeout",
	"hostport/hostport-lb/ext/v4/legacy":          "timeout",
	"hostport/hostport-lb/ext/v4/nft":             "timeout",
	// IPVS mode binds Service addresses on the node: its filter refuses
	// the ports no Service has (the daemon itself answers, newNet checks).
	"hostport/hostport-clusterip/pod/v4/ipvs": "refused",
	"hostport/hostport-lb/ext/v4/ipvs":        "refused",
	// Every port of a multi-port Service, each pod at its own number of
	// a named target port, TCP and UDP on the same port.
	"np-multiport/clusterip:http/pod/v4/*": "l1,r1 from cpod",
	"np-multiport/clusterip:alt/pod/v4/*":  "l1,r1 from cpod",
	"np-multiport/clusterip:alt/pod/v6/*":  "l1,r1 from cpod",
	"np-multiport/np:alt/ext/v4/*":         "l1,r1 from node/br,node/remote-link",
	"np-multiport/np:http/ext/v6/*":        "l1,r1 from node/br,node/remote-link",
	"dns/clusterip:dns/pod/v4/*":           "l1,r1 from cpod",
	"dns/clusterip:dns/pod/v6/*":           "l1,r1 from cpod",
	"dns/clusterip:dns-tcp/pod/v4/*":       "l1,r1 from cpod",
	"dns/clusterip:dns-tcp/pod/v6/*":       "l1,r1 from cpod",
	// UDP conntrack: the flow must have been set up (or refused) before
	// the change; kube-proxy clears an entry only for a Service port that
	// still has serving endpoints and a reply that comes from none of
	// them (pkg/proxy/conntrack/cleanup.go).
	"udp-stale/lb/ext/v4/*":              "before sa, old flow after replace: sb",
	"udp-stale/extip/ext/v6/*":           "before sa, old flow after replace: sb",
	"udp-add/clusterip/pod/v4/*":         "before refused, old flow after add: sa",
	"udp-add/np/ext/v6/*":                "before refused, old flow after add: sa",
	"udp-remove/clusterip/pod/v4/legacy": "before sa, old flow after remove: sa",
	"udp-remove/lb/ext/v4/nft":           "before sa, old flow after remove: sa",
	"udp-delete/clusterip/pod/v6/legacy": "before sa, old flow after delete: sa",
	"udp-delete/extip/ext/v4/nft":        "before sa, old flow after delete: sa",
	"udp-port/clusterip/pod/v4/legacy":   "before sa, old flow after port: sa",
	"udp-port/lb/ext/v6/nft":             "before sa, old flow after port: sa",
	// IPVS: the connection of a real server that is gone is dropped
	// (expire_nodest_conn); the VIP without a virtual server for the
	// port refuses, a deleted Service's is no longer the node's.
	"udp-remove/clusterip/pod/v4/ipvs": "before sa, old flow after remove: refused",
	"udp-remove/lb/ext/v4/ipvs":        "before sa, old flow after remove: refused",
	"udp-delete/clusterip/pod/v6/ipvs": "before sa, old flow after delete: timeout",
	"udp-delete/np/ext/v4/ipvs":        "before sa, old flow after delete: refused",
	"udp-port/clusterip/pod/v4/ipvs":   "before sa, old flow after port: refused",
	"udp-port/np/ext/v4/*":             "before sa, old flow after port: sa",
	// Terminating endpoints only when no ready one (serving ones only);
	// not-ready ones never. The health check counts ready local ones.
	"cip-ready-terminating/clusterip/pod/v4/*":       "l1,r1 from cpod",
	"cip-ready-terminating/clusterip/pod/v6/*":       "l1,r1 from cpod",
	"np-etp-local-ready-terminating/np/ext/v4/*":     "l1 from ext",
	"cip-terminating-not-serving/clusterip/pod/v4/*": "refused",
	"cip-not-ready/clusterip/pod/v4/*":               "l1 from cpod",
	"cip-not-ready/clusterip/pod/v6/*":               "l1 from cpod",
	"lb-etp-local-terminating/lb/ext/v4/*":           "tl from ext",
	"lb-etp-local-terminating/hc/ext/v4/*":           "http 503 local=0",
	"lb-affinity/lb/ext/v4/*":                        "one-sticky from " + nodeLink,
	"lb-affinity/np/pod/v6/*":                        "one-sticky from " + nodeLink,
	"lb-affinity/clusterip/pod/v4/*":                 "one-sticky from cpod",
	"cip-affinity-timeout/clusterip/pod/v4/legacy":   expiryMoves,
	"cip-affinity-timeout/clusterip/pod/v6/nft":      expiryMoves,
	// IPVS keeps the persistence template while a connection it made is
	// in its table (TCP TIME_WAIT: 2 minutes), longer than the rounds.
	"cip-affinity-timeout/clusterip/pod/v4/ipvs": expiryStays,
	// nftables mode: the same outcomes as iptables mode where iptables
	// cells pin one backend, and its own refusal of a ClusterIP's ports
	// no Service has (kube-proxy's cluster-ips set); an LB IP is not the
	// node's.
	"cip-itp-local-remote-only/clusterip/pod/v4/nftables": "timeout",
	"np-etp-local-remote-only/np/ext/v4/nftables":         "timeout",
	"hostport/hostport-clusterip/pod/v4/nftables":         "refused",
	"hostport/hostport-lb/ext/v4/nftables":                "timeout",
	"udp-remove/lb/ext/v6/nftables":                       "before sa, old flow after remove: sa",
	"udp-delete/clusterip/pod/v4/nftables":                "before sa, old flow after delete: sa",
	"udp-port/clusterip/pod/v6/nftables":                  "before sa, old flow after port: sa",
	"cip-affinity-timeout/clusterip/pod/v4/nftables":      expiryMoves,
	// Source ranges holding the node: the outside client is dropped, the
	// node's own requests pass.
	"lb-source-ranges-node/lb/ext/v4/*":       "timeout",
	"lb-source-ranges-node/lb/ext/v6/*":       "timeout",
	"lb-source-ranges-node/lb/node/v4/legacy": "l1,r1 from node/br,node/remote-link",
	"lb-source-ranges-node/lb/node/v6/nft":    "l1,r1 from node/br,node/remote-link",
	"lb-source-ranges-node/lb/node/v4/ipvs":   "l1,r1 from node/br,node/remote-link",
	// CVE-2020-8558: the node's loopback services stay closed to its
	// neighbours (the world checks that the packets arrive).
	"hostport/hostport-lo/ext/v4/*": "timeout",
	// A neighbour's packet to 127.0.0.1:<NodePort> is DNATed before the
	// localnet drop sees it, which lets DNATed packets pass: kube-proxy
	// iptables serves it (IPVS mode: route_localnet stays off, dropped);
	// without endpoints there is nothing to DNAT to and it is dropped.
	"np/np-lo/ext/v4/legacy":         "l1,r1 from node/br,node/remote-link",
	"np/np-lo/ext/v4/nft":            "l1,r1 from node/br,node/remote-link",
	"np/np-lo/ext/v4/ipvs":           "timeout",
	"np-no-endpoints/np-lo/ext/v4/*": "timeout",
	"hostport/hostport-lo/node/v4/*": hostDaemon + " from node/lo",
	// PreferClose is PreferSameZone; PreferSameNode keeps this node's
	// clients, and outside ones through its NodePorts, on its endpoint.
	"cip-prefer-close/clusterip/pod/v4/*":    "l1,z1 from cpod",
	"cip-prefer-close/clusterip/pod/v6/*":    "l1,z1 from cpod",
	"cip-zone-unhinted/clusterip/pod/v4/*":   "l1,r1,u1 from cpod",
	"cip-zone-unhinted/clusterip/pod/v6/*":   "l1,r1,u1 from cpod",
	"np-prefer-same-node/clusterip/pod/v4/*": "l1 from cpod",
	"np-prefer-same-node/clusterip/pod/v6/*": "l1 from cpod",
	"np-prefer-same-node/np/ext/v4/*":        "l1 from node/br",
	"np-prefer-same-node/np/rpod/v6/*":       "l1 from node/br",
	"np/np/rpod/v4/*":                        "l1,r1 from node/br,node/remote-link",
	"lb/lb/rpod/v6/*":                        "l1,r1 from node/br,node/remote-link",
	"long-names/clusterip/pod/v4/*":          "l1,r1 from cpod",
	"long-names/clusterip/pod/v6/*":          "l1,r1 from cpod",
	"long-names/lb/ext/v4/*":                 "l1 from ext",
	"long-names/hc/ext/v4/*":                 "http 200 local=1",
	"twin-a/clusterip/pod/v4/*":              "l1 from cpod",
	"twin-b/clusterip/pod/v4/*":              "r1 from cpod",
	"twin-a/np/ext/v6/*":                     "l1 from node/br",
	"twin-b/np/ext/v6/*":                     "r1 from node/remote-link",
	"cip-node-noipv6/clusterip/pod/v4/*":     "l1,l2 from cpod",
	"cip-node-noipv6/clusterip/pod/v6/*":     "l1,l2 from cpod",
	"proxy-health/healthz/ext/v4/*":          "http 200",
	"proxy-health/healthz-draining/ext/v4/*": "http 503",
	"proxy-health/livez-draining/ext/v4/*":   "http 200",
	"proxy-health/livez/node/v4/*":           "http 200",
}

// Position is where a client stands.
type Position struct {
	Name string
	What string
}

// Positions is the table of client positions.
var Positions = []Position{
	{"pod", "a pod on this node (source inside clusterCIDR)"},
	{"node", "the node itself (host network)"},
	{"ext", "an external client routed to the node's address"},
	{"outpod", "a pod on this node whose source is outside clusterCIDR"},
	{"rpod", "a pod on node-b, routed through this node to its NodePorts, LB IPs and externalIPs"},
}

// Frontends: how a cell reaches the Service.
const (
	FClusterIP  = "clusterip"
	FNodePort   = "np"       // the node's InternalIP (client link)
	FNodePortBr = "np-br"    // the node's address on the pod bridge
	FNodePortLo = "np-lo"    // 127.0.0.1, from the node only
	FNodePortX  = "np-other" // an address inside nodePortAddresses that is not the node's
	FLB         = "lb"
	FExtIP      = "extip"
	FHealth     = "hc" // healthCheckNodePort, HTTP on the node's InternalIP
	// The host daemon's port (not the Service's) on a Service address.
	FHostPortCIP = "hostport-clusterip"
	FHostPortLB  = "hostport-lb"
	// The host daemon's port on 127.0.0.1: from the node, and from the
	// outside client, whose 127.0.0.1 is routed to the node's link
	// address (CVE-2020-8558: route_localnet must not open the node's
	// loopback services to its neighbours).
	FHostPortLo = "hostport-lo"
	// The proxy's own health endpoints (healthzPort), HTTP.
	FHealthz = "healthz"
	FLivez   = "livez"
	// The same on a draining node (its Node tainted toBeDeleted, after
	// the run's other cells: World.Drained).
	FHealthzDraining = "healthz-draining"
	FLivezDraining   = "livez-draining"
)

// Families and backends. Backends are the host matrix's (TestMatrix):
// iptables mode on iptables-legacy and on iptables-nft, and
// BackendNFTables, both proxies in nftables mode. BackendIPVS is the VM
// matrix's (TestMatrixIPVS): both proxies in IPVS mode, their iptables
// rules written with iptables-nft.
var (
	Families        = []string{"v4", "v6"}
	Backends        = []string{"legacy", "nft", BackendNFTables}
	BackendNFTables = "nftables"
	BackendIPVS     = "ipvs"
)

// localhostNodePorts reports whether the backend's proxies serve
// NodePorts on 127.0.0.1: only iptables mode does (kube-proxy's
// --iptables-localhost-nodeports; its IPVS and nftables modes do not).
func localhostNodePorts(backend string) bool {
	return backend != BackendIPVS && backend != BackendNFTables
}

// Cell is one probe: a frontend of a shape from a position in a family.
type Cell struct {
	Shape    *Shape
	Frontend string
	Position string
	Family   string
	Backend  string
	Port     int // index in Shape.ports()
}

// Key names the cell: shape/frontend/position/family/backend, the frontend
// with ":<port name>" when the shape lists its Ports. DIFFERENCES.md and
// KNOWN_BUGS.md match it with path.Match patterns.
func (c Cell) Key() string {
	fe := c.Frontend
	if len(c.Shape.Ports) > 0 && portFrontend(fe) {
		fe += ":" + c.Shape.Ports[c.Port].Name
	}
	return strings.Join([]string{c.Shape.Name, fe, c.Position, c.Family, c.Backend}, "/")
}

// proto is the protocol of the cell's port.
func (c Cell) proto() corev1.Protocol { return c.Shape.ports()[c.Port].Proto }

// portFrontend reports whether a frontend reaches one of the Service's
// ports (not the health check's or the node daemon's).
func portFrontend(fe string) bool {
	switch fe {
	case FHealth, FHostPortCIP, FHostPortLB, FHostPortLo, FHealthz, FLivez, FHealthzDraining, FLivezDraining:
		return false
	}
	return true
}

// hasFamily reports whether the shape's Service has addresses of family.
func (s *Shape) hasFamily(f string) bool { return s.Families == "dual" || s.Families == f }

// frontends lists the shape's frontends, by rule from its spec.
func (s *Shape) frontends() []string {
	if s.HostPort {
		return []string{FHostPortCIP, FHostPortLB, FHostPortLo}
	}
	if s.ProxyHealth {
		return []string{FHealthz, FLivez, FHealthzDraining, FLivezDraining}
	}
	fs := []string{FClusterIP}
	if s.Type == np || s.Type == lb {
		fs = append(fs, FNodePort, FNodePortBr, FNodePortLo)
		if s.Profile != ProfileDefault {
			fs = append(fs, FNodePortX)
		}
	}
	if s.Type == lb {
		fs = append(fs, FLB)
	}
	if s.ExternalIPs {
		fs = append(fs, FExtIP)
	}
	if s.ETP == "Local" && s.Type == lb {
		fs = append(fs, FHealth)
	}
	return fs
}

// applies is the rule that leaves out cells that make no sense.
func applies(s *Shape, frontend, position, family string) bool {
	// A pod on node-b reaches this node's proxy only through addresses
	// routed to it: its ClusterIPs are node-b's proxy's (none runs there).
	// Not with eTP Local: both proxies send a pod's traffic to every
	// endpoint unmasqueraded (kube-proxy's short-circuit), and node-b's
	// endpoints answer rc straight, which drops the answer; whether a
	// cell then shows "l1 from rc + timeout" or "timeout" is which
	// endpoint its first two probes drew (noAnswerLimit), not a proxy's.
	if position == "rpod" && (frontend != FNodePort && frontend != FLB && frontend != FExtIP || s.ETP == "Local") {
		return false
	}
	switch frontend {
	case FClusterIP, FLB, FExtIP, FHostPortCIP, FHostPortLB:
		// The address exists only in the Service's families.
		if !s.hasFamily(family) {
			return false
		}
	case FNodePortLo:
		// Localhost NodePorts are IPv4 only and meant for the node only;
		// the outside client's 127.0.0.1 is routed to the node (not for
		// the change cells: one flow each, from the node).
		return family == "v4" && (position == "node" || position == "ext" && s.Change == "")
	case FHostPortLo:
		return family == "v4" && (position == "node" || position == "ext")
	case FHealthz, FLivez, FHealthzDraining, FLivezDraining:
		// The proxies bind 0.0.0.0 (IPv4).
		return family == "v4" && (position == "node" || position == "ext")
	case FNodePortX:
		// The other address is the external client's: probe it from inside.
		return position == "pod" || position == "node"
	case FHealth:
		return s.hasFamily(family) && (position == "ext" || position == "node")
	}
	if s.AffinityTimeout > 0 || s.Profile == ProfileNoIPv6 {
		return frontend == FClusterIP && position == "pod"
	}
	if s.Change != "" {
		// One established flow per frontend and family: from a pod to
		// the ClusterIP, from outside to the others (and, by the rule
		// above, from the node to 127.0.0.1:NodePort).
		if frontend == FClusterIP {
			return position == "pod"
		}
		return (frontend == FNodePort || frontend == FLB || frontend == FExtIP) && position == "ext"
	}
	return true
}

// Cells is the matrix of one profile on one backend.
func Cells(profile, backend string) []Cell {
	var out []Cell
	for i := range Shapes {
		s := &Shapes[i]
		if s.Profile != profile {
			continue
		}
		for _, fe := range s.frontends() {
			ports := len(s.ports())
			if !portFrontend(fe) {
				ports = 1
			}
			for port := range ports {
				for _, pos := range Positions {
					for _, fam := range Families {
						// IPVS and nftables modes serve no 127.0.0.1
						// NodePort (the np-lo cells show it): a change
						// cell there waits out newFlowWait for nothing.
						if s.Change != "" && fe == FNodePortLo && !localhostNodePorts(backend) {
							continue
						}
						if applies(s, fe, pos.Name, fam) {
							out = append(out, Cell{Shape: s, Frontend: fe, Position: pos.Name, Family: fam, Backend: backend, Port: port})
						}
					}
				}
			}
		}
	}
	return out
}

// Addresses of the world (all inside namespaces the test creates).
var (
	lbVIP4   = netip.MustParseAddr("203.0.113.10")
	lbVIP6   = netip.MustParseAddr("2001:db8:113::10")
	extIP4   = netip.MustParseAddr("198.51.100.10")
	extIP6   = netip.MustParseAddr("2001:db8:51::10")
	extNet4  = netip.MustParsePrefix("192.168.77.0/24") // the node–client link
	client4  = netip.MustParseAddr("192.168.77.2")
	client6  = netip.MustParseAddr("fd00:77::2")
	outside4 = netip.MustParseAddr("10.99.0.2")
	outside6 = netip.MustParseAddr("fd00:99::2")
)

// lbIPs is the shape's load balancer ingress, one per family it has; every
// shape has its own.
func (s *Shape) lbIPs() []netip.Addr { return s.byFamily(lbVIP4, lbVIP6) }

// externalIPs is the shape's spec.externalIPs, its own.
func (s *Shape) externalIPs() []netip.Addr { return s.byFamily(extIP4, extIP6) }

// byFamily offsets the base addresses by the shape's index in Shapes.
func (s *Shape) byFamily(v4, v6 netip.Addr) []netip.Addr {
	for i := range Shapes {
		if &Shapes[i] == s {
			break
		}
		v4, v6 = v4.Next(), v6.Next()
	}
	var out []netip.Addr
	if s.hasFamily("v4") {
		out = append(out, v4)
	}
	if s.hasFamily("v6") {
		out = append(out, v6)
	}
	return out
}

// Rule is one line of DIFFERENCES.md or KNOWN_BUGS.md: a cell pattern,
// the outcome edgeproxy is expected to show in those cells, and why.
type Rule struct {
	Pattern string
	Want    string // edgeproxy's outcome (Outcome.String) in every matched cell
	Reason  string
}

// Match reports whether the rule's pattern matches the cell key (each of
// the five parts is matched with path.Match, so * stays inside a part).
func (r Rule) Match(key string) bool {
	ok, err := path.Match(r.Pattern, key)
	return err == nil && ok
}

// ParseRules reads the list items of a rules file: lines
// "- `shape/frontend/position/family/backend` → `edgeproxy outcome` reason".
// Other lines are prose. A pattern that is not five parts or does not
// compile, or an item without its expected outcome or reason, is an error.
func ParseRules(text string) ([]Rule, error) {
	var out []Rule
	for n, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "- `") {
			continue
		}
		pat, rest, ok := strings.Cut(line[3:], "`")
		if !ok {
			return nil, fmt.Errorf("line %d: unterminated pattern", n+1)
		}
		if strings.Count(pat, "/") != 4 {
			return nil, fmt.Errorf("line %d: pattern %q: want shape/frontend/position/family/backend", n+1, pat)
		}
		if _, err := path.Match(pat, ""); err != nil {
			return nil, fmt.Errorf("line %d: pattern %q: %w", n+1, pat, err)
		}
		rest, ok = strings.CutPrefix(strings.TrimSpace(rest), "→ `")
		if !ok {
			return nil, fmt.Errorf("line %d: pattern %q: want → `edgeproxy's outcome` after it", n+1, pat)
		}
		want, rest, ok := strings.Cut(rest, "`")
		if !ok || strings.TrimSpace(want) == "" || want == nothing {
			return nil, fmt.Errorf("line %d: pattern %q: unterminated or empty outcome", n+1, pat)
		}
		reason := strings.TrimSpace(strings.TrimLeft(strings.TrimSpace(rest), "—-:"))
		if reason == "" {
			return nil, fmt.Errorf("line %d: pattern %q has no reason", n+1, pat)
		}
		out = append(out, Rule{Pattern: pat, Want: want, Reason: reason})
	}
	return out, nil
}

// matchRule returns the first rule whose pattern matches key and that
// expects edge; failing that, the first whose pattern matches key (found
// reports whether any pattern matched).
func matchRule(rules []Rule, key, edge string) (r Rule, found, expected bool) {
	for _, rule := range rules {
		if !rule.Match(key) {
			continue
		}
		if rule.Want == edge {
			return rule, true, true
		}
		if !found {
			r, found = rule, true
		}
	}
	return r, found, false
}
