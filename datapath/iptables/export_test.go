package iptables

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// BreakService makes every rendering of the named service port carry a
// rule the kernel refuses, until the test ends: a source of the other IP
// family, which iptables-restore cannot parse and reports with its line
// under both backends. It stands in for any refusal of one service's
// rules (a missing match module, a limit) so that failure isolation can
// be tested with the real kernel.
func BreakService(t testing.TB, service datapath.ServicePortName) {
	renderHook = func(u *unit) {
		if u.id.service != service || len(u.chains) == 0 {
			return
		}
		bad := netip.MustParsePrefix("fd00:bad::/64")
		for _, r := range u.chains[0].rules {
			if to, ok := r.Target.DNATTo(); ok && to.Addr().Is6() {
				bad = netip.MustParsePrefix("192.0.2.0/24")
			}
		}
		u.chains[0].rules = append(u.chains[0].rules, xtables.Rule{Matches: []xtables.Match{xtables.Src(bad)}, Target: xtables.Return})
	}
	t.Cleanup(func() { renderHook = nil })
}

// FullTamperChecks is how many tamper checks ran iptables (instead of being
// answered by an unchanged fingerprint).
func FullTamperChecks(p *Proxier) int {
	n := 0
	for _, f := range p.fams {
		n += f.fullChecks
	}
	return n
}

// SPN is the service port written s ("namespace/name:port"), for the
// tables of the tests.
func SPN(s string) datapath.ServicePortName {
	ns, rest, _ := strings.Cut(s, "/")
	n, port, _ := strings.Cut(rest, ":")
	return datapath.ServicePortName{Namespace: ns, Name: n, Port: port}
}

// RecheckEvery is how long a verified fingerprint vouches for the rules
// without a watch.
const RecheckEvery = recheckEvery

// Age moves the tamper monitor's clocks d into the past, as if d had
// passed: the last full check that passed, and the last check (whose cost
// spaces the next).
func Age(p *Proxier, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastCheck = p.lastCheck.Add(-d)
	for _, f := range p.fams {
		f.verifiedAt = f.verifiedAt.Add(-d)
	}
}

// FakeOf returns an xtables.Fake holding what one full sync of plan by
// p's family fam writes: p's rendering configuration, tables in memory.
// Without nodePortAddresses only (those are matched against the node's
// addresses, read from the kernel).
func FakeOf(t testing.TB, p *Proxier, fam datapath.Family, plan *datapath.Plan) *xtables.Fake {
	t.Helper()
	for _, f := range p.fams {
		if f.cfg.Family != fam {
			continue
		}
		if len(f.npa) > 0 || f.primary {
			t.Fatal("FakeOf: nodePortAddresses are not supported")
		}
		k := xtables.NewFake()
		c := *plan
		c.Frontends, c.Full = slices.Clone(plan.Frontends), true
		if _, err := newFakeFamily(f.cfg, k).apply(context.Background(), &c, modeRewrite); err != nil {
			t.Fatal(err)
		}
		return k
	}
	t.Fatalf("FakeOf: no family %v", fam)
	return nil
}
