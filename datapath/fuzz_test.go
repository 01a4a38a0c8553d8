package datapath

import (
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// planFrom builds a plan of up to 16 frontends from bytes: small ranges so
// that conflicts and bad values are common.
func planFrom(b []byte) *Plan {
	kinds := []Kind{ClusterIP, NodePort, ExternalIP, LoadBalancer, "Bogus"}
	protos := []Protocol{TCP, UDP, SCTP, "ICMP"}
	svcs := []ServicePortName{{Namespace: "a", Name: "x"}, {Namespace: "b", Name: "y"}, {Namespace: "c", Name: "z", Port: "p"}, {Namespace: "d", Name: "w"}}
	p := &Plan{}
	for len(b) >= 6 && len(p.Frontends) < 16 {
		f := Frontend{
			Service:  svcs[int(b[0])%len(svcs)],
			Kind:     kinds[int(b[1])%len(kinds)],
			Protocol: protos[int(b[2])%len(protos)],
			Port:     uint16(b[3] % 4),
			Family:   IPv4,
		}
		switch b[4] % 4 {
		case 0:
			f.Addr = netip.AddrFrom4([4]byte{10, 0, 0, b[4] % 3})
		case 1:
			f.Addr = netip.MustParseAddr("fd00::1")
		case 2:
			f.Addr = netip.MustParseAddr("fe80::1").WithZone("eth0")
			f.Family = IPv6
		}
		for i := range int(b[5] % 3) {
			f.Endpoints = append(f.Endpoints, Endpoint{
				Addr:   netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 0, byte(i)}), 80),
				Weight: uint32(b[5]) * 50 * uint32(i),
			})
		}
		p.Frontends = append(p.Frontends, f)
		b = b[6:]
	}
	return p
}

// ids lists the plan's frontends without endpoints, sorted.
func ids(p *Plan) string {
	var out []string
	for i := range p.Frontends {
		out = append(out, p.Frontends[i].Service.String()+" "+frontendID(&p.Frontends[i]))
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

// FuzzSanitize: whatever a plan holds, Sanitize leaves one that Validate
// accepts, keeps every frontend that was fine and unclaimed, and gives the
// same result whatever the frontends' order.
func FuzzSanitize(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 0, 1, 1, 0, 0, 1, 0, 1})
	f.Add([]byte{0, 1, 1, 0, 3, 2, 2, 4, 3, 1, 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		p := planFrom(b)
		rev := &Plan{}
		for i := len(p.Frontends) - 1; i >= 0; i-- {
			rev.Frontends = append(rev.Frontends, p.Frontends[i])
		}
		r1 := p.Sanitize(nil)
		if err := p.Validate(); err != nil {
			t.Fatalf("after Sanitize: %v", err)
		}
		r2 := rev.Sanitize(nil)
		if ids(p) != ids(rev) || len(r1) != len(r2) {
			t.Fatalf("order-dependent:\n%s\nvs\n%s\n%v\n%v", p, rev, r1, r2)
		}
	})
}

// FuzzSanitizer: over a series of plans, each Changed naming the service
// ports whose frontends differ from the plan before, a Sanitizer returns
// and leaves what Sanitize does, and what it keeps is what it would read
// from the plan anew.
func FuzzSanitizer(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 0, 1, 1, 0, 0, 1, 0, 1, 2, 1, 0, 1, 0, 1, 3, 0, 1, 1, 0, 1})
	f.Add([]byte{0, 1, 1, 0, 3, 2, 2, 4, 3, 1, 1, 0, 0, 1, 1, 0, 3, 2, 1, 1, 1, 1, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		b = b[:min(len(b), 6*16)] // 13 plans at most
		var s Sanitizer
		var prev *Plan
		gen := uint64(7)
		// Plan k is made of frontends k to k+3 of b: the next plan
		// drops one frontend and adds another.
		for k := 0; k == 0 || 6*(k+3) < len(b); k++ {
			gen++
			plan := planFrom(b[6*k : min(len(b), 6*(k+4))])
			plan.Sort()
			plan.Generation = gen
			plan.Changed = changedSince(prev, plan)
			prev = clonePlan(plan)
			whole := clonePlan(plan)
			got, want := s.Sanitize(plan, nil), whole.Sanitize(nil)
			if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(plan.Frontends, whole.Frontends) {
				t.Fatalf("plan %d: Sanitizer gave %v and\n%s\nSanitize %v and\n%s", k, got, plan, want, whole)
			}
			fresh := Sanitizer{seed: s.seed, ports: map[ServicePortName]portClaim{}} // the same seed
			fresh.reset(prev)
			if !reflect.DeepEqual(fresh.ports, s.ports) || !maps.Equal(fresh.claims, s.claims) || fresh.bad != s.bad || fresh.twice != s.twice {
				t.Fatalf("plan %d: kept %d bad, %d twice, %v; read anew %d, %d, %v", k, s.bad, s.twice, s.claims, fresh.bad, fresh.twice, fresh.claims)
			}
		}
	})
}

// changedSince names the service ports whose frontends differ between
// prev (nil: none) and next, both sorted.
func changedSince(prev, next *Plan) map[ServicePortName]bool {
	if prev == nil {
		prev = &Plan{}
	}
	out := map[ServicePortName]bool{}
	for _, p := range []*Plan{prev, next} {
		for i := range p.Frontends {
			name := p.Frontends[i].Service
			if !reflect.DeepEqual(prev.PortFrontends(name), next.PortFrontends(name)) {
				out[name] = true
			}
		}
	}
	return out
}

func clonePlan(p *Plan) *Plan {
	c := *p
	c.Frontends = slices.Clone(p.Frontends)
	return &c
}
