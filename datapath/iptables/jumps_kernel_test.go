package iptables_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/iptables"
)

// TestJumpOrderRepaired: a node whose jumps from the built-in chains stand
// in another order than this version's (an older version's: the localnet
// drop after the service portals' reject, which would answer a
// neighbour's packet to 127.0.0.1 at a NodePort without endpoints) gets
// them in order from the periodic rewrite and from the first apply after
// a restart, each jump once, and another program's rule kept in its
// place.
func TestJumpOrderRepaired(t *testing.T) {
	eachVariant(t, func(t *testing.T, v iptables.Variant) {
		// Every apply after the first is a periodic rewrite, which
		// lists nothing (the first apply and one after a failure do).
		e := newEnv(t, v, 1, func(o *iptables.Options) { o.FullSyncPeriod = time.Nanosecond })
		plan := func() *datapath.Plan {
			return &datapath.Plan{Full: true, Frontends: []datapath.Frontend{
				fe("default/web:", datapath.NodePort, datapath.TCP, netip.Addr{}, 30080, e.ep(0, 1)),
				fe("default/none:", datapath.NodePort, datapath.TCP, netip.Addr{}, 30081),
			}}
		}
		want := map[string][]string{
			"INPUT":  {"EP-LOCALNET", "EP-SERVICES", "EP-EXTERNAL", "EP-FIREWALL", "EP-NODEPORTS"},
			"OUTPUT": {"EP-LOCALNET", "EP-SERVICES", "EP-FIREWALL"},
		}
		const foreign = "-A INPUT -s 192.0.2.1/32 -j ACCEPT"
		check := func(when string) {
			t.Helper()
			for chain, targets := range want {
				rules := e.filterRules(chain)
				if got := ourJumps(rules); !slices.Equal(got, targets) {
					t.Errorf("%s: filter %s jumps to %v, want %v:\n%s", when, chain, got, targets, strings.Join(rules, "\n"))
				}
			}
			if rules := e.filterRules("INPUT"); len(rules) == 0 || rules[0] != foreign {
				t.Errorf("%s: the other program's rule is not first in INPUT:\n%s", when, strings.Join(rules, "\n"))
			}
		}
		// An older version's order: the localnet drop moved to the end
		// of INPUT and OUTPUT; another program inserts a rule at the top.
		misorder := func() {
			t.Helper()
			for _, chain := range []string{"INPUT", "OUTPUT"} {
				localnet := []string{chain, "-m", "comment", "--comment", "edgeproxy localnet martians", "-j", "EP-LOCALNET"}
				e.iptables(append([]string{"-t", "filter", "-D"}, localnet...)...)
				e.iptables(append([]string{"-t", "filter", "-A"}, localnet...)...)
				if got := ourJumps(e.filterRules(chain)); got[0] == "EP-LOCALNET" {
					t.Fatalf("filter %s still starts with the localnet drop: %v", chain, got)
				}
			}
		}

		e.mustApply(plan())
		e.iptables("-t", "filter", "-I", "INPUT", "1", "-s", "192.0.2.1/32", "-j", "ACCEPT")
		check("first apply")

		misorder()
		e.mustApply(plan())
		check("periodic rewrite")

		misorder()
		p2 := e.newProxier(nil)
		if err := e.apply(p2, plan()); err != nil {
			t.Fatal(err)
		}
		check("first apply after a restart")

		// In order, a rewrite moves nothing.
		before := strings.Join(e.filterRules("INPUT"), "\n")
		e.mustApply(plan())
		if after := strings.Join(e.filterRules("INPUT"), "\n"); after != before {
			t.Errorf("a rewrite of jumps in order changed INPUT:\n--- before\n%s\n--- after\n%s", before, after)
		}
	})
}

// filterRules is the filter table's chain as `iptables -S <chain>` lists
// its rules (without its policy).
func (e *env) filterRules(chain string) []string {
	e.t.Helper()
	var rules []string
	for _, l := range strings.Split(e.iptables("-t", "filter", "-S", chain), "\n") {
		if strings.HasPrefix(l, "-A ") {
			rules = append(rules, l)
		}
	}
	return rules
}

// ourJumps lists the targets of the rules that jump to our chains, in
// their order.
func ourJumps(rules []string) []string {
	var out []string
	for _, r := range rules {
		if _, to, ok := strings.Cut(r, " -j "); ok && strings.HasPrefix(to, "EP-") {
			out = append(out, strings.Fields(to)[0])
		}
	}
	return out
}
