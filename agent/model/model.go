// Package model holds the agent's own, Kubernetes-free view of the objects it
// reads: services split into service ports, endpoint slices and this node.
// The source package converts API objects into these types (skipping and
// counting the ones it cannot use); everything after it works on them.
package model

import (
	"encoding/json"
	"net/netip"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath"
)

// ServicePortName identifies one port of one service. It is the datapath's
// key, so that state, planner, plan and backends share one comparable key
// and never join or split strings.
type ServicePortName = datapath.ServicePortName

// TrafficDistribution is a Service's spec.trafficDistribution: a
// preference for topologically close endpoints. The empty value states
// none; a value the selection does not know is kept as written and means
// none too, as in kube-proxy (the API server accepts only known values,
// manifests are not checked).
type TrafficDistribution string

// The trafficDistribution values the selection understands.
const (
	PreferSameZone TrafficDistribution = "PreferSameZone"
	PreferClose    TrafficDistribution = "PreferClose" // older alias of PreferSameZone
	PreferSameNode TrafficDistribution = "PreferSameNode"
)

// Service is one Service, already checked: it is not headless, not
// ExternalName and meant for this proxy.
type Service struct {
	Namespace, Name string
	// Created is the creationTimestamp (zero in manifests without one).
	// When two Services claim one frontend, the older keeps it.
	Created time.Time
	// ClusterIPs, ExternalIPs and LoadBalancerIPs may mix IP families.
	// LoadBalancerIPs leaves out ingress points with ipMode Proxy.
	ClusterIPs      []netip.Addr
	ExternalIPs     []netip.Addr
	LoadBalancerIPs []netip.Addr
	SourceRanges    []netip.Prefix
	// InternalLocal and ExternalLocal are the traffic policies set to Local.
	InternalLocal bool
	ExternalLocal bool
	// HealthCheckNodePort is set for LoadBalancer services with external
	// traffic policy Local.
	HealthCheckNodePort uint16
	// Affinity is the ClientIP session affinity timeout; zero means none.
	Affinity            time.Duration
	TrafficDistribution TrafficDistribution
	// Labels and Annotations kept after stripping (see source).
	Labels      map[string]string
	Annotations map[string]string
	Ports       []ServicePort
}

// ServicePort is one port of a Service.
type ServicePort struct {
	Name     string // empty for an unnamed port
	Protocol string // TCP, UDP or SCTP
	Port     uint16
	NodePort uint16 // 0 when none
}

// EndpointSlice is the part of a discovery/v1 EndpointSlice the proxy reads.
type EndpointSlice struct {
	Namespace, Name string
	Service         string // the kubernetes.io/service-name label
	Family          Family
	Ports           []EndpointPort
	Endpoints       []Endpoint
	// TriggerTime is the endpoints.kubernetes.io/last-change-trigger-time
	// annotation: when the change that produced this slice happened. It feeds
	// the network programming latency metric; zero when absent.
	TriggerTime time.Time
}

// Family is the address family of a slice.
type Family uint8

const (
	IPv4 Family = 4
	IPv6 Family = 6
)

// EndpointPort maps a service port name to the port endpoints listen on.
type EndpointPort struct {
	Name     string
	Protocol string
	Port     uint16
}

// Endpoint is one address of a slice, with its conditions. A nil condition in
// the API is already resolved here the way kube-proxy reads it: ready
// defaults to true, serving defaults to ready, terminating to false.
type Endpoint struct {
	Addr        netip.Addr
	NodeName    string
	Zone        string
	Ready       bool
	Serving     bool
	Terminating bool
	// Hints are the topology hints; nil when there are none (most
	// endpoints: a pointer, not two lists, keeps an endpoint at 72 bytes
	// instead of 112, 3.8 MB at 10,000 Services × 10 endpoints).
	Hints *Hints
}

// Hints are an endpoint's topology hints (forZones, forNodes).
type Hints struct {
	Zones []string
	Nodes []string
}

// HintZones returns the zones the endpoint is hinted for.
func (e *Endpoint) HintZones() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Zones
}

// HintNodes returns the nodes the endpoint is hinted for.
func (e *Endpoint) HintNodes() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Nodes
}

// endpointJSON is Endpoint as the snapshot files have always held it,
// with the hints as two fields.
type endpointJSON struct {
	Addr        netip.Addr
	NodeName    string
	Zone        string
	Ready       bool
	Serving     bool
	Terminating bool
	HintZones   []string
	HintNodes   []string
}

// MarshalJSON writes e in the snapshot's layout (endpointJSON).
func (e Endpoint) MarshalJSON() ([]byte, error) {
	return json.Marshal(endpointJSON{Addr: e.Addr, NodeName: e.NodeName, Zone: e.Zone, Ready: e.Ready,
		Serving: e.Serving, Terminating: e.Terminating, HintZones: e.HintZones(), HintNodes: e.HintNodes()})
}

// UnmarshalJSON reads e from the snapshot's layout (endpointJSON).
func (e *Endpoint) UnmarshalJSON(b []byte) error {
	var j endpointJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*e = Endpoint{Addr: j.Addr, NodeName: j.NodeName, Zone: j.Zone, Ready: j.Ready, Serving: j.Serving, Terminating: j.Terminating}
	if j.HintZones != nil || j.HintNodes != nil {
		e.Hints = &Hints{Zones: j.HintZones, Nodes: j.HintNodes}
	}
	return nil
}

// PortEndpoint is an endpoint of one service port: an address with the
// port it listens on for that service port. It points at the endpoint of
// its slice, which it shares (every service port of a slice, every
// snapshot and plan built from it) and must not change: the endpoints of
// a 5,000-service node were otherwise held twice.
type PortEndpoint struct {
	*Endpoint
	Port uint16
}

// AddrPort returns the endpoint's address and port.
func (e PortEndpoint) AddrPort() netip.AddrPort { return netip.AddrPortFrom(e.Addr, e.Port) }

// Node is the node the agent runs on.
type Node struct {
	Name      string
	Zone      string // topology.kubernetes.io/zone
	Region    string // topology.kubernetes.io/region
	Labels    map[string]string
	Addresses []netip.Addr // InternalIP, then ExternalIP addresses
	// PodCIDRs are the node's pod ranges (spec.podCIDRs), at most one per
	// family: detectLocalMode NodeCIDR tells this node's pods by them.
	PodCIDRs []netip.Prefix `json:",omitempty"` // left out when none: the file format of older snapshots
	// Ineligible: the Node is being deleted or tainted
	// ToBeDeletedByClusterAutoscaler; /healthz then fails so that load
	// balancers drain it, as kube-proxy's.
	Ineligible bool
}

// EqualWeights returns n weights of 1: every endpoint alike, the weighing
// before (or without) any policy.
func EqualWeights(n int) []uint32 {
	w := make([]uint32, n)
	for i := range w {
		w[i] = 1
	}
	return w
}
