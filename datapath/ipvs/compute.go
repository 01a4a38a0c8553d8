package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

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
	setLBFirewall    = "EP-LOAD-BALANCER-FW"   // hash:ip,port: LoadBalancer frontends with source ranges
	setLBSource      = "EP-LOAD-BALANCER-SRC"  // hash:ip,port,net: allowed (frontend, source range)
	setLoopback      = "EP-LOOP-BACK"          // hash:ip,port,ip: endpoint reaching itself (hairpin)
	setNoEndpoints   = "EP-NO-ENDPOINTS"       // hash:ip,port: refuse
	setNoEndpointsLo = "EP-NO-ENDPOINTS-LOCAL" // hash:ip,port: drop (traffic policy Local)
	setNodePortPfx   = "EP-NODE-PORT-"         // + TCP/UDP/SCTP: bitmap:port
	setNodePortLoPfx = "EP-NODE-PORT-LOCAL-"   // + TCP/UDP/SCTP: bitmap:port, source kept
)

var protocols = []datapath.Protocol{datapath.TCP, datapath.UDP, datapath.SCTP}

// sets lists every set this package keeps, with its type.
func sets() []ipset.Set {
	hip := func(n string) ipset.Set { return ipset.Set{Name: n, Type: ipset.HashIPPort, Family: datapath.IPv4} }
	out := []ipset.Set{
		hip(setClusterIP), hip(setExternalIP), hip(setExternalLocal), hip(setLB), hip(setLBLocal),
		hip(setLBFirewall), hip(setNoEndpoints), hip(setNoEndpointsLo),
		{Name: setLBSource, Type: ipset.HashIPPortNet, Family: datapath.IPv4},
		{Name: setLoopback, Type: ipset.HashIPPortIP, Family: datapath.IPv4},
	}
	for _, p := range protocols {
		out = append(out,
			ipset.Set{Name: setNodePortPfx + string(p), Type: ipset.BitmapPort},
			ipset.Set{Name: setNodePortLoPfx + string(p), Type: ipset.BitmapPort})
	}
	return out
}

// config is what the computation needs besides the plan.
type config struct {
	Scheduler      string   // default scheduler; "rr" when empty
	SchedulerFlags []string // flags for the default scheduler
	NodeAddresses  []netip.Addr
}

// weightedForm is the scheduler that honours weights for one that does not.
var weightedForm = map[string]string{"rr": "wrr", "lc": "wlc"}

// desiredServer is one virtual server the kernel must hold.
type desiredServer struct {
	VS       VirtualServer
	Reals    []RealServer
	Service  string
	Weighted bool // the scheduler was switched to its weighted form
}

// desired is the whole kernel state a plan asks for.
type desired struct {
	Servers map[Key]*desiredServer
	VIPs    map[netip.Addr]bool // bound on the dummy link
	Entries map[string][]ipset.Entry
}

// compute turns a plan into the kernel state it asks for. It is pure.
// Frontends it cannot program (IPv6, for now; unknown scheduler flags; a
// virtual server another service port already claims) are left out and
// reported as datapath.PortErrors of their service port; the rest is
// returned.
func compute(cfg config, p *datapath.Plan) (*desired, error) {
	d := &desired{Servers: map[Key]*desiredServer{}, VIPs: map[netip.Addr]bool{}, Entries: map[string][]ipset.Entry{}}
	for _, s := range sets() {
		d.Entries[s.Name] = nil
	}
	var errs []error
	add := func(set string, e ipset.Entry) { d.Entries[set] = append(d.Entries[set], e) }
	for i := range p.Frontends {
		f := &p.Frontends[i]
		if f.Family != datapath.IPv4 {
			errs = append(errs, portError(f.Service, fmt.Errorf("ipvs: %s %s (%s): IPv6 is not supported yet", f.Protocol, f.AddrString(), f.Service)))
			continue
		}
		vs, weighted, err := virtualServer(cfg, f)
		if err != nil {
			errs = append(errs, portError(f.Service, err))
			continue
		}
		reals := make([]RealServer, 0, len(f.Endpoints))
		for _, e := range f.Endpoints {
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
			set := setNodePortPfx
			if f.LocalOnly {
				set = setNodePortLoPfx
			}
			add(set+string(f.Protocol), ipset.Entry{Port: f.Port})
		} else {
			d.VIPs[f.Addr] = true
		}
		for _, a := range addrs {
			v := vs
			v.Addr = a
			if prev, dup := d.Servers[v.Key()]; dup {
				errs = append(errs, portError(f.Service, fmt.Errorf("ipvs: %s of %s is also claimed by %s", v.Key(), f.Service, prev.Service)))
				continue
			}
			d.Servers[v.Key()] = &desiredServer{VS: v, Reals: reals, Service: f.Service, Weighted: weighted}
			e := ipset.Entry{Addr: a, Protocol: f.Protocol, Port: f.Port}
			switch f.Kind {
			case datapath.ClusterIP:
				add(setClusterIP, e)
			case datapath.ExternalIP:
				add(map[bool]string{false: setExternalIP, true: setExternalLocal}[f.LocalOnly], e)
			case datapath.LoadBalancer:
				add(map[bool]string{false: setLB, true: setLBLocal}[f.LocalOnly], e)
				if len(f.SourceRanges) > 0 {
					add(setLBFirewall, e)
					for _, r := range f.SourceRanges {
						if r.Addr().Is4() {
							add(setLBSource, ipset.Entry{Addr: a, Protocol: f.Protocol, Port: f.Port, Net: r})
						}
					}
				}
			}
			if len(f.Endpoints) == 0 {
				add(map[bool]string{false: setNoEndpoints, true: setNoEndpointsLo}[f.LocalOnly], e)
			}
		}
	}
	for name, es := range d.Entries {
		slices.SortFunc(es, ipset.Entry.Compare)
		d.Entries[name] = slices.Compact(es)
	}
	return d, errors.Join(errs...)
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
	if w, ok := weightedForm[v.Scheduler]; ok && !equalWeights(f.Endpoints) {
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
func portError(service string, err error) error {
	return &datapath.PortError{Service: service, Err: err}
}
