package iptables

import "testing"

// BreakService makes every rendering of the named service port carry a
// rule the kernel refuses, until the test ends. It stands in for any
// kernel-side refusal of one service's rules (a missing match module, a
// limit) so that failure isolation can be tested with the real kernel.
func BreakService(t testing.TB, service string) {
	renderHook = func(u *unit) {
		if u.service == service && len(u.chains) > 0 {
			u.chains[0].rules = append(u.chains[0].rules, "-m no-such-match-module -j RETURN")
		}
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
