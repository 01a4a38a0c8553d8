package iptables_test

import (
	"context"
	"testing"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/iptables"
)

// TestUnchangedFollowsTheKernel: Unchanged vouches for the tables only
// once the tamper monitor verified them, keeps vouching across our own
// applies, and stops at the first foreign write until a check passes again.
// The agent skips its periodic compare while it holds.
func TestUnchangedFollowsTheKernel(t *testing.T) {
	eachVariant(t, func(t *testing.T, v iptables.Variant) {
		e := newEnv(t, v, 2, nil)
		plan := &datapath.Plan{Full: true, Frontends: []datapath.Frontend{
			fe("default/x:", datapath.ClusterIP, datapath.TCP, vip, 80, e.ep(0, 1)),
		}}
		unchanged := func() (got bool) {
			t.Helper()
			if err := e.node.Do(func() error { got = e.p.Unchanged(); return nil }); err != nil {
				t.Fatal(err)
			}
			return got
		}
		verify := func() {
			t.Helper()
			if err := e.node.Do(func() error {
				bad, err := e.p.Tampered(context.Background())
				if bad {
					t.Fatal("our rules taken for tampered")
				}
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
		if unchanged() {
			t.Fatal("Unchanged before any apply")
		}
		e.mustApply(plan)
		// nf_tables: a rewrite of all our rules that nothing else was
		// committed beside verifies the tables itself, and the monitor's
		// first look needs no full check. x_tables cannot tell our write
		// from another's: that look checks in full.
		if got, want := unchanged(), v == iptables.NFT; got != want {
			t.Fatalf("Unchanged after the first apply = %v, want %v", got, want)
		}
		checks := iptables.FullTamperChecks(e.p)
		verify()
		if got, want := iptables.FullTamperChecks(e.p)-checks, map[bool]int{true: 0, false: 1}[v == iptables.NFT]; got != want {
			t.Fatalf("the first look after the first apply ran %d full checks, want %d", got, want)
		}
		if !unchanged() {
			t.Fatal("not Unchanged after a passing tamper check")
		}
		e.mustApply(&datapath.Plan{Changed: map[datapath.ServicePortName]bool{{Namespace: "default", Name: "x"}: true}, Frontends: []datapath.Frontend{
			fe("default/x:", datapath.ClusterIP, datapath.TCP, vip, 80, e.ep(1, 1)),
		}})
		if !unchanged() {
			t.Fatal("our own apply made the tables look changed")
		}
		e.iptables("-t", "nat", "-N", "SOMEONE-ELSE")
		if unchanged() {
			t.Fatal("Unchanged after a foreign write")
		}
		verify()
		if !unchanged() {
			t.Fatal("not Unchanged after the check that followed the foreign write")
		}
	})
}
