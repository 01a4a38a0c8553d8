package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/ipset"
)

// Set names. All start with "EP-" (the prefix every edgeproxy kernel
// object carries) and stay within ipset.MaxNameLen.
const (
	setClusterIP     = "EP-CLUSTER-IP"        // hash:ip,port: ClusterIP frontends
	setExternalIP    = "EP-EXTERNAL-IP"       // hash:ip,port: ExternalIP frontends, masqueraded
	setExternalLocal = "EP-EXTERNAL-IP-LOCAL" // hash:ip,port: ExternalIP frontends, source kept
	setLB            = "EP-LOAD-BALANCER"     // hash:ip,port: LoadBalancer frontends, masqueraded
	setLBLocal       = "EP-LOAD-BALANCER-LOCAL"
	setLBFirewall    = "EP-LOAD-BALANCER-FW"       // hash:ip,port: LoadBalancer frontends with source ranges
	setLBSource      = "EP-LOAD-BALANCER-SRC"      // hash:ip,port,net: allowed (frontend, source range)
	setLoopback      = "EP-LOOP-BACK"              // hash:ip,port,ip: endpoint reaching itself (hairpin)
	setNoEndpoints   = "EP-NO-ENDPOINTS"           // hash:ip,port: refuse
	setNoEndpointsLo = "EP-NO-ENDPOINTS-LOCAL"     // hash:ip,port: drop (traffic policy Local)
	setNodePortPfx   = "EP-NODE-PORT-"             // + TCP/UDP: bitmap:port; + SCTP-HASH: hash:ip,port (node address, port)
	setNodePortLoPfx = "EP-NODE-PORT-LOCAL-"       // the same, source kept
	setVIPs          = "EP-IPVS-IP"                // hash:ip: every address on the dummy link
	setHealthCheck   = "EP-HEALTH-CHECK-NODE-PORT" // bitmap:port: healthCheckNodePorts
)

var protocols = []datapath.Protocol{datapath.TCP, datapath.UDP, datapath.SCTP}

// setName is base's name for family f: IPv4 sets keep it, IPv6 ones
// are "EP-6-…" (kube-proxy's KUBE-6- convention).
func setName(base string, f datapath.Family) string {
	if f == datapath.IPv6 {
		return "EP-6-" + strings.TrimPrefix(base, "EP-")
	}
	return base
}

// sets lists every set this package keeps for family f, with its type.
func sets(f datapath.Family) []ipset.Set {
	typed := func(n string, t ipset.Type) ipset.Set { return ipset.Set{Name: setName(n, f), Type: t, Family: f} }
	out := []ipset.Set{
		typed(setLBSource, ipset.HashIPPortNet), typed(setLoopback, ipset.HashIPPortIP), typed(setVIPs, ipset.HashIP),
	}
	for _, n := range []string{setClusterIP, setExternalIP, setExternalLocal, setLB, setLBLocal, setLBFirewall, setNoEndpoints, setNoEndpointsLo} {
		out = append(out, typed(n, ipset.HashIPPort))
	}
	// bitmap:port sets hold ports only and match packets of both
	// families; the kernel ignores their family.
	out = append(out, ipset.Set{Name: setName(setHealthCheck, f), Type: ipset.BitmapPort, Family: datapath.IPv4})
	for _, p := range protocols {
		// bitmap:port sets hold ports only and match packets of both
		// families; the kernel ignores their family. SCTP ports are not
		// matched by bitmap:port: as kube-proxy, SCTP NodePorts are
		// hash:ip,port entries of each node address.
		for _, n := range []string{setNodePortPfx, setNodePortLoPfx} {
			if p == datapath.SCTP {
				out = append(out, typed(n+string(p)+"-HASH", ipset.HashIPPort))
			} else {
				out = append(out, ipset.Set{Name: setName(n+string(p), f), Type: ipset.BitmapPort, Family: datapath.IPv4})
			}
		}
	}
	return out
}

// allSets lists the sets of both families.
func allSets() []ipset.Set { return append(sets(datapath.IPv4), sets(datapath.IPv6)...) }

// legacySets are names earlier versions used: Cleanup removes them.
var legacySets = []string{setNodePortPfx + "SCTP", setNodePortLoPfx + "SCTP"} // bitmap:port, before SCTP-HASH

// config is what the computation needs besides the plan.
type config struct {
	Scheduler      string   // default scheduler; "rr" when empty
	SchedulerFlags []string // flags for the default scheduler
	NodeAddresses  []netip.Addr
	IPv6           bool // program IPv6 frontends too
}

// families are the IP families cfg programs.
func (c config) families() []datapath.Family {
	if c.IPv6 {
		return []datapath.Family{datapath.IPv4, datapath.IPv6}
	}
	return []datapath.Family{datapath.IPv4}
}

// weightedForm is the scheduler that honours weights for one that does not.
var weightedForm = map[string]string{"rr": "wrr", "lc": "wlc"}

// desiredServer is one virtual server the kernel must hold.
type desiredServer struct {
	VS       VirtualServer
	Reals    []RealServer
	Service  datapath.ServicePortName
	Weighted bool // the scheduler was switched to its weighted form
}

// desired is the whole kernel state a plan asks for.
type desired struct {
	Servers map[Key]*desiredServer
	VIPs    map[netip.Addr]bool // bound on the dummy link
	Entries map[string][]ipset.Entry
}

// compute turns a plan into the kernel state it asks for. It is pure.
// Frontends it cannot program (IPv6 ones when IPv6 is off; unknown scheduler flags; a
// virtual server another service port already claims) are left out and
// reported as datapath.PortErrors of their service port; the rest is
// returned.
func compute(cfg config, p *datapath.Plan) (*desired, error) {
	d := &desired{Servers: map[Key]*desiredServer{}, VIPs: map[netip.Addr]bool{}, Entries: map[string][]ipset.Entry{}}
	for _, fam := range cfg.families() {
		for _, s := range sets(fam) {
			d.Entries[s.Name] = nil
		}
	}
	// The health checks answer on every node address, service addresses
	// included (EP-IPVS-HOST-FILTER lets them in, as kube-proxy's
	// KUBE-IPVS-FILTER).
	for _, fam := range cfg.families() {
		for _, port := range p.HealthCheckPorts {
			n := setName(setHealthCheck, fam)
			d.Entries[n] = append(d.Entries[n], ipset.Entry{Port: port})
		}
	}
	var errs []error
	for i := range p.Frontends {
		f := &p.Frontends[i]
		if !slices.Contains(cfg.families(), f.Family) {
			errs = append(errs, portError(f.Service, fmt.Errorf("ipvs: %s %s (%s): IPv6 is off on this node (no IPv6 address or no ip6tables)", f.Protocol, f.AddrString(), f.Service)))
			continue
		}
		add := func(set string, e ipset.Entry) { n := setName(set, f.Family); d.Entries[n] = append(d.Entries[n], e) }
		vs, weighted, err := virtualServer(cfg, f)
		if err != nil {
			errs = append(errs, portError(f.Service, err))
			continue
		}
		reals := make([]RealServer, 0, len(f.Endpoints))
		for _, e := range realEndpoints(f) {
			reals = append(reals, RealServer{Addr: e.Addr, Weight: int(e.Weight)})
			add(setLoopback, ipset.Entry{Addr: e.Addr.Addr(), Protocol: f.Protocol, Port: e.Addr.Port(), Addr2: e.Addr.Addr()})
		}
		addrs := []netip.Addr{f.Addr}
		if f.Kind == datapath.NodePort {
			addrs = addrs[:0]
			for _, a := range cfg.NodeAddresses {
				if datapath.FamilyOf(a) == f.Family {
					addrs = append(addrs, a)
				}
			}
			if f.Protocol != datapath.SCTP {
				add(nodePortSet(f), ipset.Entry{Port: f.Port})
			}
		} else {
			d.VIPs[f.Addr] = true
			add(setVIPs, ipset.Entry{Addr: f.Addr})
		}
		for _, a := range addrs {
			v := vs
			v.Addr = a
			if prev, dup := d.Servers[v.Key()]; dup {
				errs = append(errs, portError(f.Service, fmt.Errorf("ipvs: %s of %s is also claimed by %s", v.Key(), f.Service, prev.Service)))
				continue
			}
			d.Servers[v.Key()] = &desiredServer{VS: v, Reals: reals, Service: f.Service, Weighted: weighted}
			d.addressEntries(cfg, f, a)
		}
	}
	for name, es := range d.Entries {
		slices.SortFunc(es, ipset.Entry.Compare)
		d.Entries[name] = slices.Compact(es)
	}
	return d, errors.Join(errs...)
}

// addressEntries adds the set entries of frontend f on address a.
func (d *desired) addressEntries(cfg config, f *datapath.Frontend, a netip.Addr) {
	add := func(set string, e ipset.Entry) { n := setName(set, f.Family); d.Entries[n] = append(d.Entries[n], e) }
	e := ipset.Entry{Addr: a, Protocol: f.Protocol, Port: f.Port}
	switch f.Kind {
	case datapath.NodePort:
		if f.Protocol == datapath.SCTP {
			add(nodePortSet(f), e)
		}
	case datapath.ClusterIP:
		add(setClusterIP, e)
	case datapath.ExternalIP:
		add(map[bool]string{false: setExternalIP, true: setExternalLocal}[f.LocalOnly], e)
	case datapath.LoadBalancer:
		add(map[bool]string{false: setLB, true: setLBLocal}[f.LocalOnly], e)
		if len(f.SourceRanges) > 0 {
			add(setLBFirewall, e)
			for _, r := range f.SourceRanges {
				if datapath.FamilyOf(r.Addr()) == f.Family {
					add(setLBSource, ipset.Entry{Addr: a, Protocol: f.Protocol, Port: f.Port, Net: r})
				}
			}
			if allowFromNode(f.SourceRanges, cfg.NodeAddresses) {
				add(setLBSource, ipset.Entry{Addr: a, Protocol: f.Protocol, Port: f.Port, Net: netip.PrefixFrom(a, a.BitLen())})
			}
		}
	}
	// Without endpoints a frontend refuses, as IPVS does for a virtual
	// server without real servers (an ICMP port unreachable), also with
	// internal traffic policy Local; an external one of policy Local whose
	// service has endpoints on other nodes (Drop) sends pods and the node
	// to those and drops the rest (realEndpoints).
	if len(f.Endpoints) == 0 {
		add(map[bool]string{false: setNoEndpoints, true: setNoEndpointsLo}[f.LocalOnly && f.Drop], e)
	}
}

// nodePortSet is the NodePort set (before setName) of NodePort frontend f.
func nodePortSet(f *datapath.Frontend) string {
	name := setNodePortPfx + string(f.Protocol)
	if f.LocalOnly {
		name = setNodePortLoPfx + string(f.Protocol)
	}
	if f.Protocol == datapath.SCTP {
		name += "-HASH"
	}
	return name
}

// allowFromNode reports whether a source range admits the node (one of
// its addresses): then the node itself may reach the load balancer
// address, whose packets carry that address as their source (it is bound
// on the dummy link), as kube-proxy allows. Otherwise they are dropped
// like any source outside the ranges.
func allowFromNode(ranges []netip.Prefix, node []netip.Addr) bool {
	for _, r := range ranges {
		for _, a := range node {
			if r.Contains(a) {
				return true
			}
		}
	}
	return false
}

// realEndpoints are the real servers of f's virtual server: its endpoints
// or, for an external frontend with traffic policy Local and no endpoint
// on this node, the cluster-wide set (kube-proxy's IPVS fallback,
// kubernetes#97081). Only pods and the node itself get through to them:
// EP-IPVS-FILTER drops other sources, as f is in EP-NO-ENDPOINTS-LOCAL.
func realEndpoints(f *datapath.Frontend) []datapath.Endpoint {
	if f.LocalOnly && f.Kind.External() && len(f.Endpoints) == 0 {
		return f.Cluster
	}
	return f.Endpoints
}

// virtualServer derives the scheduler, flags and persistence of f.
func virtualServer(cfg config, f *datapath.Frontend) (VirtualServer, bool, error) {
	v := VirtualServer{Addr: f.Addr, Protocol: f.Protocol, Port: f.Port, Scheduler: f.Scheduler}
	flags := f.SchedulerFlags
	if v.Scheduler == "" {
		v.Scheduler, flags = cfg.Scheduler, cfg.SchedulerFlags
		if v.Scheduler == "" {
			v.Scheduler = "rr"
		}
	}
	for _, name := range flags {
		bit, ok := schedulerFlags[name]
		if !ok {
			return v, false, fmt.Errorf("ipvs: %s %s (%s): unknown scheduler flag %q", f.Protocol, f.AddrString(), f.Service, name)
		}
		v.Flags |= bit
	}
	if f.Affinity > 0 {
		v.Flags |= FlagPersistent
		v.Timeout = uint32((f.Affinity.Seconds()) + 0.999)
	}
	weighted := false
	if w, ok := weightedForm[v.Scheduler]; ok && !equalWeights(realEndpoints(f)) {
		v.Scheduler, weighted = w, true
	}
	return v, weighted, nil
}

func equalWeights(es []datapath.Endpoint) bool {
	for _, e := range es {
		if e.Weight != es[0].Weight {
			return false
		}
	}
	return true
}

// portError marks err as concerning service port service alone, so that
// the agent shows it as refused and counts the rest of the sync as done.
func portError(service datapath.ServicePortName, err error) error {
	return &datapath.PortError{Service: service, Err: err}
}
