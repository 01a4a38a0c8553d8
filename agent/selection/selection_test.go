package selection

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/agent/model"
)

// The cluster: zone "a" holds nodes a1 and a2, zone "b" holds node b1. The
// agent runs on a1 unless a case says otherwise.
var (
	nodeA1 = &model.Node{Name: "a1", Zone: "a"}
	nodeB1 = &model.Node{Name: "b1", Zone: "b"}
	// nodeNoZone is a node without a topology.kubernetes.io/zone label.
	nodeNoZone = &model.Node{Name: "a1"}
)

var zoneOf = map[string]string{"a1": "a", "a2": "a", "b1": "b"}

// ep builds an endpoint 10.0.0.<n>:8080 on node with conditions cond:
// "R" ready (and serving), "ST" serving and terminating, "T" terminating and
// not serving, "N" not ready and not terminating. Options "z:<zone>" and
// "n:<node>" add hints; "nozone" clears the endpoint's own zone field.
func ep(n int, node, cond string, opts ...string) model.PortEndpoint {
	e := model.Endpoint{
		Addr:     netip.AddrFrom4([4]byte{10, 0, 0, byte(n)}),
		NodeName: node,
		Zone:     zoneOf[node],
	}
	switch cond {
	case "R":
		e.Ready, e.Serving = true, true
	case "ST":
		e.Serving, e.Terminating = true, true
	case "T":
		e.Terminating = true
	case "N":
	default:
		panic("bad condition " + cond)
	}
	for _, o := range opts {
		if (strings.HasPrefix(o, "z:") || strings.HasPrefix(o, "n:")) && e.Hints == nil {
			e.Hints = &model.Hints{}
		}
		switch {
		case strings.HasPrefix(o, "z:"):
			e.Hints.Zones = append(e.Hints.Zones, o[2:])
		case strings.HasPrefix(o, "n:"):
			e.Hints.Nodes = append(e.Hints.Nodes, o[2:])
		case o == "nozone":
			e.Zone = ""
		default:
			panic("bad option " + o)
		}
	}
	return model.PortEndpoint{Endpoint: &e, Port: 8080}
}

// show renders choices as "<last octet>:<L if local>:<reason>" for compact
// expectations.
func show(cs []Choice) []string {
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		l := "-"
		if c.Local {
			l = "L"
		}
		out = append(out, fmt.Sprintf("%d %s %s", c.Addr.As4()[3], l, c.Reason))
	}
	return out
}

var (
	clusterIPOnly = model.ServicePort{Name: "http", Protocol: "TCP", Port: 80}
	withNodePort  = model.ServicePort{Name: "http", Protocol: "TCP", Port: 80, NodePort: 30080}
)

type selectCase struct {
	name string
	svc  model.Service
	port model.ServicePort
	node *model.Node // default nodeA1
	eps  []model.PortEndpoint

	internal, internalSkipped []string
	// external and externalSkipped: when both are nil and the service's
	// external policy is Cluster, External must equal Internal.
	external, externalSkipped []string
	// cluster: when nil, Cluster must equal Internal if the internal policy
	// is Cluster, and be nil if the port never uses the cluster-wide set.
	cluster    []string
	topology   string
	localReady int
	notes      []string
}

func runCases(t *testing.T, cases []selectCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			node := tc.node
			if node == nil {
				node = nodeA1
			}
			port := tc.port
			if port == (model.ServicePort{}) {
				port = clusterIPOnly
			}
			r := Select(&tc.svc, port, tc.eps, node)

			eq := func(what string, got, want []string) {
				t.Helper()
				if !slices.Equal(got, want) {
					t.Errorf("%s:\n got  %q\n want %q", what, got, want)
				}
			}
			eq("Internal", show(r.Internal), tc.internal)
			eq("InternalSkipped", show(r.InternalSkipped), tc.internalSkipped)
			if tc.external == nil && tc.externalSkipped == nil && !tc.svc.ExternalLocal {
				eq("External (= Internal)", show(r.External), tc.internal)
				eq("ExternalSkipped (= InternalSkipped)", show(r.ExternalSkipped), tc.internalSkipped)
			} else {
				eq("External", show(r.External), tc.external)
				eq("ExternalSkipped", show(r.ExternalSkipped), tc.externalSkipped)
			}
			switch {
			case tc.cluster != nil:
				eq("Cluster", show(r.Cluster), tc.cluster)
			case !tc.svc.InternalLocal:
				eq("Cluster (= Internal)", show(r.Cluster), tc.internal)
			default:
				if r.Cluster != nil {
					t.Errorf("Cluster = %q, want nil", show(r.Cluster))
				}
			}
			if r.Topology != tc.topology {
				t.Errorf("Topology = %q, want %q", r.Topology, tc.topology)
			}
			if r.LocalReady != tc.localReady {
				t.Errorf("LocalReady = %d, want %d", r.LocalReady, tc.localReady)
			}
			eq("Notes", r.Notes, tc.notes)
		})
	}
}

func TestReadinessFallback(t *testing.T) {
	runCases(t, []selectCase{{
		name:       "all ready, local and remote",
		eps:        []model.PortEndpoint{ep(1, "a1", "R"), ep(2, "a2", "R"), ep(3, "b1", "R")},
		internal:   []string{"1 L ready", "2 - ready", "3 - ready"},
		localReady: 1,
	}, {
		name: "ready ones win over every other condition",
		eps: []model.PortEndpoint{
			ep(1, "a1", "R"), ep(2, "a2", "N"), ep(3, "b1", "ST"), ep(4, "b1", "T"),
		},
		internal: []string{"1 L ready"},
		internalSkipped: []string{
			"2 - not ready", "3 - terminating (ready endpoints exist)", "4 - terminating, not serving",
		},
		localReady: 1,
	}, {
		name:            "no ready: serving-terminating fallback",
		eps:             []model.PortEndpoint{ep(1, "a1", "ST"), ep(2, "a2", "N"), ep(3, "b1", "ST"), ep(4, "b1", "T")},
		internal:        []string{"1 L " + ReasonTerminatingServing, "3 - " + ReasonTerminatingServing},
		internalSkipped: []string{"2 - not ready", "4 - terminating, not serving"},
		localReady:      0,
		notes:           []string{"no ready endpoints: using 2 terminating-serving"},
	}, {
		name:            "nothing usable",
		eps:             []model.PortEndpoint{ep(1, "a1", "N"), ep(2, "b1", "T")},
		internal:        []string{},
		internalSkipped: []string{"1 L not ready", "2 - terminating, not serving"},
		notes:           []string{"no usable endpoints"},
	}, {
		name:            "no endpoints",
		internal:        []string{},
		internalSkipped: []string{},
		notes:           []string{"no endpoints"},
	}, {
		name:            "nil node: nothing is local",
		node:            &model.Node{},
		eps:             []model.PortEndpoint{ep(1, "a1", "R"), ep(2, "", "R")},
		internal:        []string{"1 - ready", "2 - ready"},
		internalSkipped: []string{},
	}})
}

func TestInternalTrafficPolicyLocal(t *testing.T) {
	local := model.Service{InternalLocal: true}
	runCases(t, []selectCase{{
		name:            "local ready only, no remote fallback",
		svc:             local,
		eps:             []model.PortEndpoint{ep(1, "a1", "R"), ep(2, "a2", "R"), ep(3, "a1", "N")},
		internal:        []string{"1 L ready, local"},
		internalSkipped: []string{"2 - " + ReasonNotLocalInternal, "3 L not ready"},
		external:        []string{}, externalSkipped: []string{}, // no external frontends: unused
		localReady: 1,
	}, {
		name:            "no local endpoint: dropped although remote ones are ready",
		svc:             local,
		eps:             []model.PortEndpoint{ep(2, "a2", "R"), ep(3, "b1", "R")},
		internal:        []string{},
		internalSkipped: []string{"2 - " + ReasonNotLocalInternal, "3 - " + ReasonNotLocalInternal},
		external:        []string{}, externalSkipped: []string{},
		notes: []string{"internalTrafficPolicy Local: no usable local endpoint, internal traffic is dropped"},
	}, {
		name: "local set falls back on its own while remote ones are ready",
		svc:  local,
		eps:  []model.PortEndpoint{ep(1, "a1", "ST"), ep(2, "a2", "R"), ep(3, "a1", "T")},
		internal: []string{
			"1 L " + ReasonLocalTermServing,
		},
		internalSkipped: []string{"2 - " + ReasonNotLocalInternal, "3 L terminating, not serving"},
		external:        []string{}, externalSkipped: []string{},
		localReady: 0,
	}, {
		name:            "local ready wins over local serving-terminating",
		svc:             local,
		eps:             []model.PortEndpoint{ep(1, "a1", "ST"), ep(2, "a1", "R")},
		internal:        []string{"2 L ready, local"},
		internalSkipped: []string{"1 L terminating (ready endpoints exist)"},
		external:        []string{}, externalSkipped: []string{},
		localReady: 1,
	}, {
		name:     "with a NodePort the cluster-wide set still serves external traffic",
		svc:      local,
		port:     withNodePort,
		eps:      []model.PortEndpoint{ep(1, "a1", "R"), ep(2, "b1", "R")},
		internal: []string{"1 L ready, local"}, internalSkipped: []string{"2 - " + ReasonNotLocalInternal},
		external: []string{"1 L ready", "2 - ready"}, externalSkipped: []string{},
		cluster:    []string{"1 L ready", "2 - ready"},
		localReady: 1,
	}, {
		name: "topology is not applied to the local set",
		svc:  local,
		eps:  []model.PortEndpoint{ep(1, "a1", "R", "z:b"), ep(2, "b1", "R", "z:b")},
		// The local endpoint is hinted for zone b only; policy Local ignores hints.
		internal:        []string{"1 L ready, local"},
		internalSkipped: []string{"2 - " + ReasonNotLocalInternal},
		external:        []string{}, externalSkipped: []string{},
		localReady: 1,
	}})
}

func TestExternalTrafficPolicyLocal(t *testing.T) {
	local := model.Service{ExternalLocal: true, HealthCheckNodePort: 32000}
	runCases(t, []selectCase{{
		name:            "external gets local endpoints, internal the whole cluster",
		svc:             local,
		port:            withNodePort,
		eps:             []model.PortEndpoint{ep(1, "a1", "R"), ep(2, "a2", "R"), ep(3, "b1", "ST")},
		internal:        []string{"1 L ready", "2 - ready"},
		internalSkipped: []string{"3 - terminating (ready endpoints exist)"},
		external:        []string{"1 L ready, local"},
		externalSkipped: []string{"2 - " + ReasonNotLocalExternal, "3 - " + ReasonNotLocalExternal},
		localReady:      1,
	}, {
		name:            "no local endpoint: external traffic dropped, short-circuit set remains",
		svc:             local,
		port:            withNodePort,
		eps:             []model.PortEndpoint{ep(2, "a2", "R"), ep(3, "b1", "R")},
		internal:        []string{"2 - ready", "3 - ready"},
		internalSkipped: []string{},
		external:        []string{},
		externalSkipped: []string{"2 - " + ReasonNotLocalExternal, "3 - " + ReasonNotLocalExternal},
		localReady:      0,
		notes:           []string{"externalTrafficPolicy Local: no usable local endpoint, external traffic is dropped"},
	}, {
		name:            "local serving-terminating keeps external traffic flowing but does not count as healthy",
		svc:             local,
		port:            withNodePort,
		eps:             []model.PortEndpoint{ep(1, "a1", "ST"), ep(2, "b1", "R")},
		internal:        []string{"2 - ready"},
		internalSkipped: []string{"1 L terminating (ready endpoints exist)"},
		external:        []string{"1 L " + ReasonLocalTermServing},
		externalSkipped: []string{"2 - " + ReasonNotLocalExternal},
		localReady:      0,
	}, {
		name:     "both policies Local",
		svc:      model.Service{InternalLocal: true, ExternalLocal: true, LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("192.0.2.10")}},
		eps:      []model.PortEndpoint{ep(1, "a1", "R"), ep(2, "b1", "R")},
		internal: []string{"1 L ready, local"}, internalSkipped: []string{"2 - " + ReasonNotLocalInternal},
		external: []string{"1 L ready, local"}, externalSkipped: []string{"2 - " + ReasonNotLocalExternal},
		// Externally accessible: the short-circuit set exists.
		cluster:    []string{"1 L ready", "2 - ready"},
		localReady: 1,
	}, {
		name: "topology applies to the short-circuit set, not to External",
		svc:  local,
		port: withNodePort,
		eps: []model.PortEndpoint{
			ep(1, "a1", "R", "z:a"), ep(2, "a2", "R", "z:a"), ep(3, "b1", "R", "z:b"),
		},
		internal:        []string{"1 L " + ReasonReadyZoneHint, "2 - " + ReasonReadyZoneHint},
		internalSkipped: []string{"3 - " + ReasonOtherZone},
		external:        []string{"1 L ready, local"},
		externalSkipped: []string{"2 - " + ReasonNotLocalExternal, "3 - " + ReasonNotLocalExternal},
		topology:        TopologySameZone,
		localReady:      1,
	}})
}

func TestTopologyHints(t *testing.T) {
	// Hints as the EndpointSlice controller writes them for PreferSameZone
	// and PreferSameNode.
	zoneHinted := []model.PortEndpoint{
		ep(1, "a1", "R", "z:a"), ep(2, "a2", "R", "z:a"), ep(3, "b1", "R", "z:b"),
	}
	nodeHinted := []model.PortEndpoint{
		ep(1, "a1", "R", "z:a", "n:a1"), ep(2, "a2", "R", "z:a", "n:a2"), ep(3, "b1", "R", "z:b", "n:b1"),
	}
	runCases(t, []selectCase{{
		name:            "zone hints for this zone",
		svc:             model.Service{TrafficDistribution: model.PreferSameZone},
		eps:             zoneHinted,
		internal:        []string{"1 L " + ReasonReadyZoneHint, "2 - " + ReasonReadyZoneHint},
		internalSkipped: []string{"3 - " + ReasonOtherZone},
		topology:        TopologySameZone,
		localReady:      1,
	}, {
		name:            "zone hints seen from the other zone",
		svc:             model.Service{TrafficDistribution: model.PreferClose},
		node:            nodeB1,
		eps:             zoneHinted,
		internal:        []string{"3 L " + ReasonReadyZoneHint},
		internalSkipped: []string{"1 - " + ReasonOtherZone, "2 - " + ReasonOtherZone},
		topology:        TopologySameZone,
		localReady:      1,
	}, {
		name:            "hints are followed even without trafficDistribution (annotation-driven hints)",
		svc:             model.Service{Annotations: map[string]string{"service.kubernetes.io/topology-mode": "Auto"}},
		eps:             []model.PortEndpoint{ep(1, "a1", "R", "z:a"), ep(3, "b1", "R", "z:a")},
		internal:        []string{"1 L " + ReasonReadyZoneHint, "3 - " + ReasonReadyZoneHint},
		internalSkipped: []string{},
		topology:        TopologySameZone,
		localReady:      1,
	}, {
		name:            "a ready endpoint without hint: hints ignored",
		eps:             []model.PortEndpoint{ep(1, "a1", "R", "z:a"), ep(2, "a2", "R"), ep(3, "b1", "R", "z:b")},
		internal:        []string{"1 L ready", "2 - ready", "3 - ready"},
		internalSkipped: []string{},
		localReady:      1,
		notes:           []string{"zone hints ignored: some ready endpoints have none"},
	}, {
		name:            "a not-ready endpoint without hint does not matter",
		eps:             []model.PortEndpoint{ep(1, "a1", "R", "z:a"), ep(2, "a2", "N"), ep(3, "b1", "R", "z:b")},
		internal:        []string{"1 L " + ReasonReadyZoneHint},
		internalSkipped: []string{"2 - not ready", "3 - " + ReasonOtherZone},
		topology:        TopologySameZone,
		localReady:      1,
	}, {
		name:            "no endpoint hinted for this zone: hints ignored",
		eps:             []model.PortEndpoint{ep(2, "a2", "R", "z:b"), ep(3, "b1", "R", "z:b")},
		internal:        []string{"2 - ready", "3 - ready"},
		internalSkipped: []string{},
		notes:           []string{`zone hints ignored: none for zone "a"`},
	}, {
		name:            "node without zone label: hints ignored",
		node:            nodeNoZone,
		eps:             zoneHinted,
		internal:        []string{"1 L ready", "2 - ready", "3 - ready"},
		internalSkipped: []string{},
		localReady:      1,
		notes:           []string{"zone hints ignored: this node has no zone label"},
	}, {
		name:            "node hints for this node",
		svc:             model.Service{TrafficDistribution: model.PreferSameNode},
		eps:             nodeHinted,
		internal:        []string{"1 L " + ReasonReadyNodeHint},
		internalSkipped: []string{"2 - " + ReasonOtherNode, "3 - " + ReasonOtherNode},
		topology:        TopologySameNode,
		localReady:      1,
	}, {
		name:            "node hints, none for this node: zone hints used",
		svc:             model.Service{TrafficDistribution: model.PreferSameNode},
		eps:             nodeHinted[1:],
		internal:        []string{"2 - " + ReasonReadyZoneHint},
		internalSkipped: []string{"3 - " + ReasonOtherZone},
		topology:        TopologySameZone,
		notes:           []string{`node hints ignored: none for node "a1"`},
	}, {
		name:            "node hints on some endpoints only: zone hints used",
		eps:             []model.PortEndpoint{ep(1, "a1", "R", "z:a", "n:a1"), ep(2, "a2", "R", "z:a"), ep(3, "b1", "R", "z:b")},
		internal:        []string{"1 L " + ReasonReadyZoneHint, "2 - " + ReasonReadyZoneHint},
		internalSkipped: []string{"3 - " + ReasonOtherZone},
		topology:        TopologySameZone,
		localReady:      1,
		notes:           []string{"node hints ignored: some ready endpoints have none"},
	}, {
		name:            "node hints for nobody here, no zone hints: everything",
		eps:             []model.PortEndpoint{ep(2, "a2", "R", "n:a2"), ep(3, "b1", "R", "n:b1")},
		internal:        []string{"2 - ready", "3 - ready"},
		internalSkipped: []string{},
		// No zone hints at all: nothing to say about zones.
		notes: []string{`node hints ignored: none for node "a1"`},
	}, {
		name: "no ready endpoints: topology ignored in the fallback",
		eps: []model.PortEndpoint{
			ep(1, "a1", "ST", "z:a"), ep(3, "b1", "ST", "z:b"), ep(4, "b1", "T", "z:b"),
		},
		internal:        []string{"1 L " + ReasonTerminatingServing, "3 - " + ReasonTerminatingServing},
		internalSkipped: []string{"4 - terminating, not serving"},
		notes:           []string{"no ready endpoints: using 2 terminating-serving"},
	}, {
		name: "terminating endpoints in this zone are not used while other zones are ready",
		eps: []model.PortEndpoint{
			ep(1, "a1", "ST", "z:a"), ep(3, "b1", "R", "z:b"),
		},
		internal:        []string{"3 - ready"},
		internalSkipped: []string{"1 L terminating (ready endpoints exist)"},
		// Hints describe only the ready endpoint, hinted for zone b.
		notes: []string{`zone hints ignored: none for zone "a"`},
	}})
}

func TestTrafficDistributionWithoutHints(t *testing.T) {
	plain := []model.PortEndpoint{ep(1, "a1", "R"), ep(2, "a2", "R"), ep(3, "b1", "R")}
	runCases(t, []selectCase{{
		name:            "no trafficDistribution, no hints: everything, no notes",
		eps:             plain,
		internal:        []string{"1 L ready", "2 - ready", "3 - ready"},
		internalSkipped: []string{},
		localReady:      1,
	}, {
		name:            "PreferSameZone derives zone hints from endpoint zones",
		svc:             model.Service{TrafficDistribution: model.PreferSameZone},
		eps:             plain,
		internal:        []string{"1 L " + ReasonReadyZoneHint, "2 - " + ReasonReadyZoneHint},
		internalSkipped: []string{"3 - " + ReasonOtherZone},
		topology:        TopologySameZone,
		localReady:      1,
		notes:           []string{"trafficDistribution PreferSameZone: slices carry no hints, derived from each endpoint's own zone"},
	}, {
		name:            "PreferClose is the same as PreferSameZone",
		svc:             model.Service{TrafficDistribution: model.PreferClose},
		node:            nodeB1,
		eps:             plain,
		internal:        []string{"3 L " + ReasonReadyZoneHint},
		internalSkipped: []string{"1 - " + ReasonOtherZone, "2 - " + ReasonOtherZone},
		topology:        TopologySameZone,
		localReady:      1,
		notes:           []string{"trafficDistribution PreferClose: slices carry no hints, derived from each endpoint's own zone"},
	}, {
		name:            "PreferSameNode derives node hints",
		svc:             model.Service{TrafficDistribution: model.PreferSameNode},
		eps:             plain,
		internal:        []string{"1 L " + ReasonReadyNodeHint},
		internalSkipped: []string{"2 - " + ReasonOtherNode, "3 - " + ReasonOtherNode},
		topology:        TopologySameNode,
		localReady:      1,
		notes:           []string{"trafficDistribution PreferSameNode: slices carry no hints, derived from each endpoint's own node and zone"},
	}, {
		name:            "PreferSameNode with nothing on this node falls back to the zone",
		svc:             model.Service{TrafficDistribution: model.PreferSameNode},
		eps:             plain[1:],
		internal:        []string{"2 - " + ReasonReadyZoneHint},
		internalSkipped: []string{"3 - " + ReasonOtherZone},
		topology:        TopologySameZone,
		notes: []string{
			"trafficDistribution PreferSameNode: slices carry no hints, derived from each endpoint's own node and zone",
			`node hints ignored: none for node "a1"`,
		},
	}, {
		name:            "PreferSameZone with nothing in this zone: everything",
		svc:             model.Service{TrafficDistribution: model.PreferSameZone},
		node:            &model.Node{Name: "c1", Zone: "c"},
		eps:             plain,
		internal:        []string{"1 - ready", "2 - ready", "3 - ready"},
		internalSkipped: []string{},
		notes: []string{
			"trafficDistribution PreferSameZone: slices carry no hints, derived from each endpoint's own zone",
			`zone hints ignored: none for zone "c"`,
		},
	}, {
		name:            "an endpoint without zone: derived hints ignored",
		svc:             model.Service{TrafficDistribution: model.PreferSameZone},
		eps:             []model.PortEndpoint{ep(1, "a1", "R"), ep(2, "a2", "R", "nozone")},
		internal:        []string{"1 L ready", "2 - ready"},
		internalSkipped: []string{},
		localReady:      1,
		notes: []string{
			"trafficDistribution PreferSameZone: slices carry no hints, derived from each endpoint's own zone",
			"zone hints ignored: some ready endpoints have none",
		},
	}, {
		name:     "real hints on some endpoints: nothing derived, hints ignored",
		svc:      model.Service{TrafficDistribution: model.PreferSameZone},
		eps:      []model.PortEndpoint{ep(1, "a1", "R", "z:a"), ep(3, "b1", "R")},
		internal: []string{"1 L ready", "3 - ready"}, internalSkipped: []string{},
		localReady: 1,
		notes:      []string{"zone hints ignored: some ready endpoints have none"},
	}, {
		name:            "unknown trafficDistribution: nothing derived",
		svc:             model.Service{TrafficDistribution: "PreferSomewhere"},
		eps:             plain,
		internal:        []string{"1 L ready", "2 - ready", "3 - ready"},
		internalSkipped: []string{},
		localReady:      1,
	}, {
		name:            "no ready endpoints: nothing derived",
		svc:             model.Service{TrafficDistribution: model.PreferSameZone},
		eps:             []model.PortEndpoint{ep(1, "a1", "ST"), ep(3, "b1", "ST")},
		internal:        []string{"1 L " + ReasonTerminatingServing, "3 - " + ReasonTerminatingServing},
		internalSkipped: []string{},
		notes:           []string{"no ready endpoints: using 2 terminating-serving"},
	}})
}

func TestSessionAffinityPassesThrough(t *testing.T) {
	eps := []model.PortEndpoint{ep(1, "a1", "R"), ep(3, "b1", "R")}
	plain := Select(&model.Service{}, clusterIPOnly, eps, nodeA1)
	sticky := Select(&model.Service{Affinity: 10800_000_000_000}, clusterIPOnly, eps, nodeA1)
	if !slices.Equal(show(plain.Internal), show(sticky.Internal)) {
		t.Errorf("affinity changed the selection: %q vs %q", show(plain.Internal), show(sticky.Internal))
	}
}

func TestCountLocalReady(t *testing.T) {
	http := []model.PortEndpoint{ep(1, "a1", "R"), ep(2, "a1", "R"), ep(3, "b1", "R"), ep(4, "a1", "ST")}
	https := slices.Clone(http)
	for i := range https {
		https[i].Port = 8443
	}
	v6 := ep(1, "a1", "R")
	v6.Addr = netip.MustParseAddr("fd00::1")
	cases := []struct {
		node  string
		lists [][]model.PortEndpoint
		want  int
	}{
		{"a1", [][]model.PortEndpoint{http}, 2},
		{"a1", [][]model.PortEndpoint{http, https}, 2}, // same addresses on two ports count once
		{"a1", [][]model.PortEndpoint{http, https, {v6}}, 3},
		{"b1", [][]model.PortEndpoint{http, https}, 1},
		{"a2", [][]model.PortEndpoint{http}, 0},
		{"", [][]model.PortEndpoint{{ep(9, "", "R")}}, 0},
	}
	for _, tc := range cases {
		if got := CountLocalReady(tc.node, tc.lists...); got != tc.want {
			t.Errorf("CountLocalReady(%q, %d lists) = %d, want %d", tc.node, len(tc.lists), got, tc.want)
		}
	}
}

// Usable decides refuse (no usable endpoint anywhere) versus drop (only the
// traffic policy leaves this node without one), as kube-proxy's
// CategorizeEndpoints does with hasAnyEndpoints.
func TestUsable(t *testing.T) {
	local := &model.Service{InternalLocal: true, ExternalLocal: true}
	for _, tc := range []struct {
		name string
		eps  []model.PortEndpoint
		want bool
	}{
		{"none", nil, false},
		{"only not ready", []model.PortEndpoint{ep(1, "b1", "N"), ep(2, "b1", "T")}, false},
		{"remote ready", []model.PortEndpoint{ep(1, "b1", "R")}, true},
		{"remote serving-terminating", []model.PortEndpoint{ep(1, "b1", "ST")}, true},
	} {
		if got := Select(local, withNodePort, tc.eps, nodeA1).Usable; got != tc.want {
			t.Errorf("%s: Usable = %v, want %v", tc.name, got, tc.want)
		}
	}
}
