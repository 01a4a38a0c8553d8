package datapath

import (
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"strings"
)

// Refusal is a frontend, or a whole service port, left out of a plan with
// the reason. One bad service port never stops the others: what a backend
// must not be given is taken out and reported, and the rest is programmed.
type Refusal struct {
	// Service is the service port (Frontend.Service) concerned.
	Service ServicePortName `json:"service"`
	// Frontend is the frontend left out (Frontend.String without the
	// endpoints' part), or empty when the whole service port is.
	Frontend string `json:"frontend,omitempty"`
	Reason   string `json:"reason"`
	// Conflict: another service port claimed the same frontend first.
	Conflict bool `json:"conflict,omitempty"`
}

func (r Refusal) String() string {
	if r.Frontend == "" {
		return r.Service.String() + ": " + r.Reason
	}
	return r.Service.String() + " " + r.Frontend + ": " + r.Reason
}

// PortError is a service port a backend could not program while it
// programmed the rest of the plan. Backends return them (joined with
// errors.Join) so that the caller can tell a refused service port from a
// failed apply.
type PortError struct {
	Service ServicePortName
	Err     error
}

func (e *PortError) Error() string {
	return fmt.Sprintf("service port %s left out: %v", e.Service, e.Err)
}
func (e *PortError) Unwrap() error { return e.Err }

// SplitPortErrors separates the PortErrors in err (as joined by
// errors.Join, to any depth) from every other error, which is returned
// joined as rest; rest is nil when err held only PortErrors.
func SplitPortErrors(err error) (ports []*PortError, rest error) {
	var others []error
	var walk func(error)
	walk = func(e error) {
		if pe, ok := e.(*PortError); ok {
			ports = append(ports, pe)
			return
		}
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, c := range j.Unwrap() {
				walk(c)
			}
			return
		}
		others = append(others, e)
	}
	if err != nil {
		walk(err)
	}
	return ports, errors.Join(others...)
}

// CheckFrontend returns the problems of one frontend (see Plan.Validate)
// as one error, or nil: the one home of the per-frontend invariants, for
// backends that refuse a bad frontend alone rather than the whole plan.
func CheckFrontend(f *Frontend) error {
	probs := frontendProblems(f)
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("frontend %s %s (%s): %s", f.Protocol, f.AddrString(), f.Service, strings.Join(probs, "; "))
}

// frontendProblems lists what breaks the invariants a Backend relies on in
// one frontend, taken alone.
func frontendProblems(f *Frontend) []string {
	var out []string
	switch f.Protocol {
	case TCP, UDP, SCTP:
	default:
		out = append(out, fmt.Sprintf("unknown protocol %q", f.Protocol))
	}
	if f.Port == 0 {
		out = append(out, "port 0")
	}
	if f.Family != IPv4 && f.Family != IPv6 {
		out = append(out, fmt.Sprintf("unknown family %d", f.Family))
	}
	if f.Addr.IsValid() && FamilyOf(f.Addr) != f.Family {
		out = append(out, fmt.Sprintf("address family %d does not match family %d", FamilyOf(f.Addr), f.Family))
	}
	if f.Addr.Zone() != "" {
		out = append(out, "address has a zone")
	}
	if !f.Addr.IsValid() && f.Kind != NodePort {
		out = append(out, "only NodePort frontends may have no address")
	}
	switch f.Kind {
	case ClusterIP, NodePort, ExternalIP, LoadBalancer:
	default:
		out = append(out, fmt.Sprintf("unknown kind %q", f.Kind))
	}
	if f.Drop && len(f.Endpoints) > 0 {
		out = append(out, "drop set on a frontend with endpoints")
	}
	if len(f.Cluster) > 0 && !f.LocalOnly {
		out = append(out, "a short-circuit set on a frontend that is not LocalOnly")
	}
	for _, e := range f.Endpoints {
		out = endpointProblems(out, f, e)
	}
	for _, e := range f.Cluster {
		out = endpointProblems(out, f, e)
	}
	return out
}

// endpointProblems appends what is wrong with endpoint e of f to out.
func endpointProblems(out []string, f *Frontend, e Endpoint) []string {
	if e.Weight == 0 || e.Weight > MaxWeight {
		out = append(out, fmt.Sprintf("endpoint %s: weight %d out of range 1..%d", e.Addr, e.Weight, MaxWeight))
	}
	if !e.Addr.Addr().IsValid() || FamilyOf(e.Addr.Addr()) != f.Family {
		out = append(out, fmt.Sprintf("endpoint %s is not IPv%d", e.Addr, f.Family))
	}
	if e.Addr.Port() == 0 {
		out = append(out, fmt.Sprintf("endpoint %s has port 0", e.Addr))
	}
	return out
}

// Sanitize takes out of p what a Backend must not be given and returns
// why, so that Validate then passes:
//
//   - a service port with a frontend that breaks an invariant is left out
//     whole;
//   - when several service ports claim one frontend (same kind, protocol,
//     address and port), the one that first orders before the others keeps
//     it and the others lose that frontend only, as Conflict refusals.
//     first(a, b) reports whether service port a takes precedence over b;
//     it must be a strict order, so that the outcome does not depend on the
//     order of the plan. Nil orders by name.
//
// Sanitize does not change Changed; the caller marks the service ports
// whose refusals changed.
func (p *Plan) Sanitize(first func(a, b ServicePortName) bool) []Refusal {
	if first == nil {
		first = func(a, b ServicePortName) bool { return a.Compare(b) < 0 }
	}
	var out []Refusal
	bad := map[ServicePortName]bool{}
	for i := range p.Frontends {
		f := &p.Frontends[i]
		if probs := frontendProblems(f); len(probs) > 0 && !bad[f.Service] {
			bad[f.Service] = true
			out = append(out, Refusal{Service: f.Service, Reason: fmt.Sprintf("frontend %s %s: %s", f.Protocol, f.AddrString(), strings.Join(probs, "; "))})
		}
	}
	owner := make(map[Key]int, len(p.Frontends))
	dups := false
	for i := range p.Frontends {
		f := &p.Frontends[i]
		if bad[f.Service] {
			continue
		}
		k := f.Key()
		j, dup := owner[k]
		dups = dups || dup
		if !dup || (p.Frontends[j].Service != f.Service && first(f.Service, p.Frontends[j].Service)) {
			owner[k] = i
		}
	}
	if len(bad) == 0 && !dups {
		return nil // nothing to take out: the plan stays as it is
	}
	fs := make([]Frontend, 0, len(p.Frontends))
	for i := range p.Frontends {
		f := &p.Frontends[i]
		if bad[f.Service] {
			continue
		}
		j := owner[f.Key()]
		if j == i {
			fs = append(fs, *f)
			continue
		}
		if w := &p.Frontends[j]; w.Service != f.Service {
			out = append(out, Refusal{
				Service: f.Service, Frontend: frontendID(f), Conflict: true,
				Reason: fmt.Sprintf("%s %s/%s is already served by %s", f.Kind, f.AddrString(), f.Protocol, w.Service),
			})
		} // else the same frontend twice in one service port: one is kept
	}
	p.Frontends = fs
	slices.SortFunc(out, func(a, b Refusal) int {
		if c := a.Service.Compare(b.Service); c != 0 {
			return c
		}
		return strings.Compare(a.Frontend, b.Frontend)
	})
	return out
}

// frontendID names a frontend without its endpoints.
func frontendID(f *Frontend) string {
	return fmt.Sprintf("%s %s %s", f.Protocol, f.AddrString(), f.Kind)
}

// Sanitizer is Sanitize for the plans of one planner in turn, each of
// whose Changed names every service port whose frontends differ from the
// plan before (the planner's, before any Sanitize). It keeps what it found
// in each service port, so that a plan in which no service port breaks an
// invariant and no frontend is claimed twice is passed in the time of its
// changed ports: at 10k Services, Sanitize's walk of every frontend was a
// quarter of a one-Service sync. A plan with something to take out is
// sanitized whole by Sanitize, and so is one whose Generation does not
// follow the last one's. The zero Sanitizer is ready for use.
type Sanitizer struct {
	gen   uint64
	ports map[ServicePortName]portClaim
	// claims counts the claims of each frontend Key, by its hash: two
	// keys that share a hash count as one claimed twice, which only costs
	// a whole Sanitize.
	claims map[uint64]int32
	seed   maphash.Seed
	bad    int // service ports with a broken frontend
	twice  int // hashes claimed more than once
	// unsorted: the last plan was not in Compare's order (against Plan's
	// contract), so its ports cannot be found by name: the next plan is
	// read whole too, and every such plan is sanitized whole.
	unsorted bool
}

// portClaim is what one service port claims: its frontends' keys (hashed)
// and whether one of its frontends breaks an invariant.
type portClaim struct {
	keys []uint64
	bad  bool
}

// Sanitize does what p.Sanitize(first) does and returns the same.
func (s *Sanitizer) Sanitize(p *Plan, first func(a, b ServicePortName) bool) []Refusal {
	if s.ports == nil || s.unsorted || p.Generation != s.gen+1 {
		s.reset(p)
	} else {
		for name := range p.Changed {
			s.drop(name)
			if fs := p.PortFrontends(name); len(fs) > 0 {
				s.add(name, fs)
			}
		}
	}
	s.gen = p.Generation
	if !s.unsorted && s.bad == 0 && s.twice == 0 {
		return nil
	}
	return p.Sanitize(first)
}

// reset forgets what it knew and reads every service port of p.
func (s *Sanitizer) reset(p *Plan) {
	if s.ports == nil {
		s.seed = maphash.MakeSeed()
	}
	s.ports = make(map[ServicePortName]portClaim)
	s.claims = make(map[uint64]int32, len(p.Frontends))
	s.bad, s.twice, s.unsorted = 0, 0, false
	for i := 0; i < len(p.Frontends); {
		j := i + 1
		for j < len(p.Frontends) && p.Frontends[j].Service == p.Frontends[i].Service {
			j++
		}
		name := p.Frontends[i].Service
		if i > 0 && p.Frontends[i-1].Service.Compare(name) > 0 {
			// Out of order (a port split in two is too): what is
			// kept is not used until a sorted plan is read whole.
			s.unsorted = true
		}
		s.add(name, p.Frontends[i:j])
		i = j
	}
}

// add records the frontends fs of the service port name, which holds none.
func (s *Sanitizer) add(name ServicePortName, fs []Frontend) {
	c := portClaim{keys: make([]uint64, len(fs))}
	for i := range fs {
		f := &fs[i]
		c.bad = c.bad || len(frontendProblems(f)) > 0
		h := maphash.Comparable(s.seed, f.Key())
		c.keys[i] = h
		if s.claims[h]++; s.claims[h] == 2 {
			s.twice++
		}
	}
	if c.bad {
		s.bad++
	}
	s.ports[name] = c
}

// drop forgets what the service port name claimed.
func (s *Sanitizer) drop(name ServicePortName) {
	c, ok := s.ports[name]
	if !ok {
		return
	}
	for _, h := range c.keys {
		switch s.claims[h]--; s.claims[h] {
		case 1:
			s.twice--
		case 0:
			delete(s.claims, h)
		}
	}
	if c.bad {
		s.bad--
	}
	delete(s.ports, name)
}
