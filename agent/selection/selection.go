// Package selection applies the endpoint semantics every kube-proxy user
// relies on: for one port of one Service, in one IP family, it decides which
// endpoints receive cluster-internal traffic and which receive external
// traffic, and says why for every endpoint it kept or left out.
//
// The rules follow kube-proxy v1.36 (pkg/proxy/topology.go and the service
// port's traffic-policy helpers):
//
// # Ready, serving, terminating
//
// A set of endpoints uses the Ready ones. Only when a set has no Ready
// endpoint at all does it fall back to endpoints that are Serving and
// Terminating (a pod shutting down that still passes its readiness probe), so
// that a rolling update of the last replicas does not black-hole traffic.
// Endpoints that are neither Ready nor Serving-Terminating are never used.
// The fallback is decided per set: the cluster-wide set falls back only when
// no endpoint anywhere is Ready; the node-local set falls back on its own when
// no local endpoint is Ready, even if remote ones are.
//
// # Traffic policies
//
// internalTrafficPolicy Local: ClusterIP traffic goes to local endpoints
// only (NodeName equal to this node's name). There is no fallback to remote
// endpoints: with no usable local endpoint, internal traffic is dropped.
//
// externalTrafficPolicy Local: NodePort, ExternalIP and LoadBalancer traffic
// arriving from outside goes to local endpoints only, again with no fallback.
// Traffic to an external address that starts on this node or in a pod is
// "short-circuited" by kube-proxy to the cluster-wide set instead, so that
// policy Local never breaks in-cluster reachability of a LoadBalancer IP;
// Result.Cluster is that set.
//
// With policy Cluster (the default) a category uses the cluster-wide set.
//
// # Topology
//
// Topology narrows only the cluster-wide set, never a policy-Local set. As in
// kube-proxy, the decision rests on the hints the EndpointSlice controller
// wrote (forNodes, forZones), which it writes only when the Service asks for
// them (trafficDistribution PreferSameNode, PreferSameZone or its older alias
// PreferClose, or the service.kubernetes.io/topology-mode annotation):
//
//   - same node: used when every Ready endpoint carries a node hint and at
//     least one is hinted for this node; the set is then the Ready endpoints
//     hinted for this node.
//   - otherwise same zone: used when every Ready endpoint carries a zone hint
//     and at least one is hinted for this node's zone (a node without a zone
//     label matches none); the set is then the Ready endpoints hinted for
//     this zone.
//   - otherwise no topology: every Ready endpoint.
//
// Only Ready endpoints are looked at. When the set falls back to
// Serving-Terminating endpoints, topology is ignored.
//
// Extension beyond kube-proxy: when the Service sets trafficDistribution but
// no Ready endpoint carries any hint at all (slices written by hand, by a
// manifest directory, or by a controller that does not set hints), the hints
// are derived from the endpoints' own fields the way the EndpointSlice
// controller would write them: PreferSameZone and PreferClose give each
// endpoint a zone hint for its own zone; PreferSameNode gives it a node hint
// for its own node and a zone hint for its own zone. The rules above then
// apply unchanged, including the fallbacks, and Result.Notes says so. The
// topology-mode annotation is not derived this way: its hints come from the
// controller's capacity-proportional allocation, which cannot be
// reconstructed from one endpoint.
//
// # Not decided here
//
// Session affinity passes through untouched (the datapath reads
// model.Service.Affinity). Weights and schedulers are the policy chain's job.
package selection

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/edgeproxy/edgeproxy/agent/model"
)

// Reasons given in Choice.Reason for chosen endpoints.
const (
	ReasonReady              = "ready"
	ReasonReadyNodeHint      = "ready, hinted for this node"
	ReasonReadyZoneHint      = "ready, hinted for this zone"
	ReasonLocalReady         = "ready, local"
	ReasonTerminatingServing = "terminating-serving fallback (no ready endpoints)"
	ReasonLocalTermServing   = "terminating-serving fallback (no local ready endpoints)"
)

// Reasons given in Choice.Reason for endpoints left out.
const (
	ReasonNotReady           = "not ready"
	ReasonTerminatingUnused  = "terminating (ready endpoints exist)"
	ReasonTerminatingNotServ = "terminating, not serving"
	ReasonOtherNode          = "ready, hinted for other nodes"
	ReasonOtherZone          = "ready, hinted for other zones"
	ReasonNotLocalInternal   = "not local (internalTrafficPolicy Local)"
	ReasonNotLocalExternal   = "not local (externalTrafficPolicy Local)"
)

// Topology modes reported in Result.Topology.
const (
	TopologyNone     = ""
	TopologySameZone = string(model.PreferSameZone)
	TopologySameNode = string(model.PreferSameNode)
)

// Choice is one endpoint with the verdict for one traffic category.
type Choice struct {
	model.PortEndpoint
	// Local is true when the endpoint runs on this node.
	Local bool
	// Reason says, in a few words, why the endpoint was chosen or left out.
	Reason string
}

// Result is the built-in selection for one service port in one IP family.
// Every slice keeps the order of the endpoints Select was given.
type Result struct {
	// Internal receives ClusterIP traffic. Empty means that traffic is
	// rejected (no endpoints) or, under internalTrafficPolicy Local, dropped.
	Internal []Choice
	// External receives NodePort, ExternalIP and LoadBalancer traffic that
	// comes from outside the node. It is computed even for a port without
	// external frontends; the caller ignores it then.
	External []Choice
	// Cluster is the cluster-wide set (topology applied). Under
	// externalTrafficPolicy Local, traffic to an external address that
	// originates on this node or in a pod goes here instead of External.
	// Nil when the port never uses the cluster-wide set (internal policy
	// Local and no external frontends).
	Cluster []Choice
	// Usable reports whether any endpoint, on any node, is Ready or
	// Serving-Terminating. kube-proxy refuses traffic to a Service without
	// usable endpoints, but drops traffic that only its traffic policy
	// Local leaves without endpoints (some exist, none on this node).
	Usable bool
	// InternalSkipped and ExternalSkipped are the endpoints left out of
	// Internal and External, each with the reason.
	InternalSkipped []Choice
	ExternalSkipped []Choice
	// Topology is the topology mode applied to the cluster-wide set:
	// TopologyNone, TopologySameZone or TopologySameNode.
	Topology string
	// LocalReady counts the distinct addresses of this port's local Ready
	// endpoints (Serving-Terminating ones do not count, so a load balancer
	// drains a node whose pods are shutting down). kube-proxy's
	// healthCheckNodePort reports this count per Service across all its
	// ports and families; use CountLocalReady for that.
	LocalReady int
	// Notes explain decisions that are not visible per endpoint, such as
	// ignored topology hints or a traffic category left empty.
	Notes []string
}

// Select applies the built-in selection to eps, the endpoints of one port of
// svc in one IP family, already merged across slices and de-duplicated, as
// seen from node. See the package documentation for the rules. A nil node
// is treated as a node with no name and no zone: nothing is local.
func Select(svc *model.Service, port model.ServicePort, eps []model.PortEndpoint, node *model.Node) Result {
	var nodeName, zone string
	if node != nil {
		nodeName, zone = node.Name, node.Zone
	}
	isLocal := func(ep model.PortEndpoint) bool { return nodeName != "" && ep.NodeName == nodeName }

	var r Result
	r.LocalReady = countLocalReady(nodeName, nil, eps)
	r.Usable = slices.ContainsFunc(eps, func(ep model.PortEndpoint) bool { return ep.Ready || servingTerminating(ep) })

	usesCluster := !svc.InternalLocal || externallyAccessible(svc, port)
	var cluster, clusterSkipped []Choice
	if usesCluster {
		cluster, clusterSkipped, r.Topology, r.Notes = selectCluster(svc, eps, nodeName, zone, isLocal)
		r.Cluster = cluster
	}

	if svc.InternalLocal {
		r.Internal, r.InternalSkipped = selectLocal(eps, isLocal, ReasonNotLocalInternal)
		if len(r.Internal) == 0 {
			r.Notes = append(r.Notes, "internalTrafficPolicy Local: no usable local endpoint, internal traffic is dropped")
		}
	} else {
		r.Internal, r.InternalSkipped = cluster, clusterSkipped
	}
	if svc.ExternalLocal {
		r.External, r.ExternalSkipped = selectLocal(eps, isLocal, ReasonNotLocalExternal)
		if len(r.External) == 0 && externallyAccessible(svc, port) {
			r.Notes = append(r.Notes, "externalTrafficPolicy Local: no usable local endpoint, external traffic is dropped")
		}
	} else {
		r.External, r.ExternalSkipped = cluster, clusterSkipped
		if !usesCluster {
			// Internal policy Local and no external frontends: there is
			// no external traffic and no cluster-wide set to give it.
			r.External, r.ExternalSkipped = nil, nil
		}
	}
	return r
}

// CountLocalReady counts the distinct addresses of Ready endpoints on node
// nodeName over any number of endpoint lists: pass every port and every IP
// family of one Service to get the number kube-proxy's healthCheckNodePort
// server reports for it (an address listening on two ports counts once).
func CountLocalReady(nodeName string, lists ...[]model.PortEndpoint) int {
	seen := map[netip.Addr]struct{}{}
	n := 0
	for _, eps := range lists {
		n += countLocalReady(nodeName, seen, eps)
	}
	return n
}

func countLocalReady(nodeName string, seen map[netip.Addr]struct{}, eps []model.PortEndpoint) int {
	if nodeName == "" {
		return 0
	}
	if seen == nil {
		seen = map[netip.Addr]struct{}{}
	}
	n := 0
	for _, ep := range eps {
		if ep.NodeName != nodeName || !ep.Ready {
			continue
		}
		if _, dup := seen[ep.Addr]; dup {
			continue
		}
		seen[ep.Addr] = struct{}{}
		n++
	}
	return n
}

// externallyAccessible mirrors kube-proxy's test: the port has a NodePort,
// or the Service has external or load-balancer IPs (of any family: the
// model does not split them per family).
func externallyAccessible(svc *model.Service, port model.ServicePort) bool {
	return port.NodePort != 0 || len(svc.ExternalIPs) > 0 || len(svc.LoadBalancerIPs) > 0
}

// unusedReason is why an endpoint that is not Ready is left out of a set
// that uses Ready endpoints (fallback false) or of one that fell back to
// Serving-Terminating endpoints (fallback true).
func unusedReason(ep model.PortEndpoint, fallback bool) string {
	switch {
	case ep.Terminating && !ep.Serving:
		return ReasonTerminatingNotServ
	case ep.Terminating && !fallback:
		return ReasonTerminatingUnused
	default:
		return ReasonNotReady
	}
}

func servingTerminating(ep model.PortEndpoint) bool { return ep.Serving && ep.Terminating }

// selectCluster builds the cluster-wide set: Ready endpoints narrowed by
// topology, or all Serving-Terminating endpoints when none is Ready.
func selectCluster(svc *model.Service, eps []model.PortEndpoint, nodeName, zone string, isLocal func(model.PortEndpoint) bool) (chosen, skipped []Choice, mode string, notes []string) {
	hints, derivedNote := effectiveHints(svc, eps)
	mode, notes = topologyMode(eps, hints, nodeName, zone)
	if derivedNote != "" {
		notes = append([]string{derivedNote}, notes...)
	}

	anyReady := slices.ContainsFunc(eps, func(ep model.PortEndpoint) bool { return ep.Ready })
	for i, ep := range eps {
		c := Choice{PortEndpoint: ep, Local: isLocal(ep)}
		switch {
		case ep.Ready:
			switch mode {
			case TopologySameNode:
				if slices.Contains(hints[i].nodes, nodeName) {
					c.Reason = ReasonReadyNodeHint
				} else {
					c.Reason = ReasonOtherNode
				}
			case TopologySameZone:
				if slices.Contains(hints[i].zones, zone) {
					c.Reason = ReasonReadyZoneHint
				} else {
					c.Reason = ReasonOtherZone
				}
			default:
				c.Reason = ReasonReady
			}
			if c.Reason == ReasonOtherNode || c.Reason == ReasonOtherZone {
				skipped = append(skipped, c)
			} else {
				chosen = append(chosen, c)
			}
		case !anyReady && servingTerminating(ep):
			c.Reason = ReasonTerminatingServing
			chosen = append(chosen, c)
		default:
			c.Reason = unusedReason(ep, !anyReady)
			skipped = append(skipped, c)
		}
	}
	switch {
	case len(eps) == 0:
		notes = append(notes, "no endpoints")
	case !anyReady && len(chosen) > 0:
		notes = append(notes, fmt.Sprintf("no ready endpoints: using %d terminating-serving", len(chosen)))
	case len(chosen) == 0:
		notes = append(notes, "no usable endpoints")
	}
	return chosen, skipped, mode, notes
}

// selectLocal builds a policy-Local set: local Ready endpoints, or local
// Serving-Terminating ones when no local endpoint is Ready. Topology does
// not apply. notLocal is the reason given to remote endpoints.
func selectLocal(eps []model.PortEndpoint, isLocal func(model.PortEndpoint) bool, notLocal string) (chosen, skipped []Choice) {
	anyLocalReady := slices.ContainsFunc(eps, func(ep model.PortEndpoint) bool { return isLocal(ep) && ep.Ready })
	for _, ep := range eps {
		c := Choice{PortEndpoint: ep, Local: isLocal(ep)}
		switch {
		case !c.Local:
			c.Reason = notLocal
			skipped = append(skipped, c)
		case ep.Ready:
			c.Reason = ReasonLocalReady
			chosen = append(chosen, c)
		case !anyLocalReady && servingTerminating(ep):
			c.Reason = ReasonLocalTermServing
			chosen = append(chosen, c)
		default:
			c.Reason = unusedReason(ep, !anyLocalReady)
			skipped = append(skipped, c)
		}
	}
	return chosen, skipped
}

// hintSet is the topology hints of one endpoint, explicit or derived.
type hintSet struct {
	zones, nodes []string
}

// effectiveHints returns the hints per endpoint (same index as eps). They
// are the slices' own hints, unless the Service sets trafficDistribution and
// no Ready endpoint carries any hint: then they are derived from the
// endpoints' zone and node, and note says so.
func effectiveHints(svc *model.Service, eps []model.PortEndpoint) (hints []hintSet, note string) {
	hints = make([]hintSet, len(eps))
	anyReady, anyHint := false, false
	for i, ep := range eps {
		hints[i] = hintSet{zones: ep.HintZones(), nodes: ep.HintNodes()}
		if ep.Ready {
			anyReady = true
			if ep.Hints != nil {
				anyHint = true
			}
		}
	}
	if !anyReady || anyHint {
		return hints, ""
	}
	var byNode bool
	switch svc.TrafficDistribution {
	case model.PreferSameNode:
		byNode = true
	case model.PreferSameZone, model.PreferClose:
	default:
		return hints, ""
	}
	for i, ep := range eps {
		var h hintSet
		if ep.Zone != "" {
			h.zones = []string{ep.Zone}
		}
		if byNode && ep.NodeName != "" {
			h.nodes = []string{ep.NodeName}
		}
		hints[i] = h
	}
	what := "zone"
	if byNode {
		what = "node and zone"
	}
	return hints, fmt.Sprintf("trafficDistribution %s: slices carry no hints, derived from each endpoint's own %s", svc.TrafficDistribution, what)
}

// topologyMode decides, from the Ready endpoints' hints, which topology
// applies to the cluster-wide set, with notes on hints it had to ignore.
func topologyMode(eps []model.PortEndpoint, hints []hintSet, nodeName, zone string) (string, []string) {
	var ready, withNode, forNode, withZone, forZone int
	for i, ep := range eps {
		if !ep.Ready {
			continue
		}
		ready++
		if h := hints[i].nodes; len(h) > 0 {
			withNode++
			if nodeName != "" && slices.Contains(h, nodeName) {
				forNode++
			}
		}
		if h := hints[i].zones; len(h) > 0 {
			withZone++
			if zone != "" && slices.Contains(h, zone) {
				forZone++
			}
		}
	}
	if ready == 0 {
		return TopologyNone, nil
	}
	var notes []string
	switch {
	case withNode == ready && forNode > 0:
		return TopologySameNode, nil
	case withNode == ready:
		notes = append(notes, fmt.Sprintf("node hints ignored: none for node %q", nodeName))
	case withNode > 0:
		notes = append(notes, "node hints ignored: some ready endpoints have none")
	}
	switch {
	case withZone == ready && forZone > 0:
		return TopologySameZone, notes
	case withZone == ready && zone == "":
		notes = append(notes, "zone hints ignored: this node has no zone label")
	case withZone == ready:
		notes = append(notes, fmt.Sprintf("zone hints ignored: none for zone %q", zone))
	case withZone > 0:
		notes = append(notes, "zone hints ignored: some ready endpoints have none")
	}
	return TopologyNone, notes
}
