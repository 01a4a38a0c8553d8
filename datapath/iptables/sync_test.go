package iptables

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

var discardLog = slog.New(slog.DiscardHandler)

// TestTransactionOnState: what one transaction does to a given state of
// the tables, and what it refuses (when built, or when applied).
// testUnit owns the objects the transaction tests add for a unit.
var testUnit = &unitID{datapath.ServicePortName{Namespace: "ns", Name: "u"}, datapath.TCP}

func TestTransactionOnState(t *testing.T) {
	svcA := xtables.Chain{Table: xtables.NAT, Name: "EP-SVC-A"}
	svcs := xtables.Chain{Table: xtables.NAT, Name: chainServices}
	toA := xtables.Rule{Matches: []xtables.Match{xtables.DstHost(netip.MustParseAddr("10.96.0.1")), xtables.DPort("tcp", 80)}, Comment: "a/b:c cluster IP", Target: xtables.JumpTo("EP-SVC-A")}
	dnat := xtables.Rule{Matches: []xtables.Match{xtables.Proto("tcp")}, Target: xtables.DNAT(netip.MustParseAddrPort("10.244.0.2:8080"))}
	state := func() *xtables.Fake {
		k := xtables.NewFake()
		err := k.RestoreNoFlush(context.Background(), []byte("*nat\n:EP-SERVICES - [0:0]\n:EP-SVC-A - [0:0]\n"+
			"-A EP-SVC-A -p tcp -j DNAT --to-destination 10.244.0.9:80\n"+
			`-A EP-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -m comment --comment "a/b:c cluster IP" -j EP-SVC-A`+"\nCOMMIT\n"))
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	for _, tc := range []struct {
		name     string
		build    func(tx *xtables.Transaction[*unitID])
		want     []string // lines of the dump after, in order
		buildErr string   // refused when built
		applyErr string   // refused by the tables
	}{{
		name: "declare empties a chain and refills it",
		build: func(tx *xtables.Transaction[*unitID]) {
			tx.Declare(testUnit, svcA)
			tx.Add(testUnit, svcA, &dnat)
		},
		want: []string{":EP-SVC-A", "-A EP-SVC-A -p tcp -j DNAT --to-destination 10.244.0.2:8080"},
	}, {
		name: "delete of a chain still jumped to fails",
		build: func(tx *xtables.Transaction[*unitID]) {
			tx.Declare(nil, svcA)
			tx.Delete(svcA)
		},
		applyErr: "referenced",
	}, {
		name: "delete with the jumps to it rewritten",
		build: func(tx *xtables.Transaction[*unitID]) {
			tx.Declare(nil, svcs)
			tx.Declare(nil, svcA)
			tx.Delete(svcA)
		},
		want: []string{":EP-SERVICES\n:INPUT\n"},
	}, {
		name: "insert puts a jump first",
		build: func(tx *xtables.Transaction[*unitID]) {
			tx.Insert(xtables.Chain{Table: xtables.NAT, Name: "PREROUTING"}, &xtables.Rule{Comment: "edgeproxy service portals", Target: xtables.JumpTo(chainServices)})
		},
		want: []string{":PREROUTING\n-A PREROUTING -m comment --comment \"edgeproxy service portals\" -j EP-SERVICES\n"},
	}, {
		name:     "a rule in a chain not declared is refused",
		build:    func(tx *xtables.Transaction[*unitID]) { tx.Add(testUnit, svcA, &dnat) },
		buildErr: "unit ns/u tcp: rule in nat/EP-SVC-A: chain not declared",
	}, {
		name: "a chain name over 28 characters is refused",
		build: func(tx *xtables.Transaction[*unitID]) {
			tx.Declare(testUnit, xtables.Chain{Table: xtables.NAT, Name: "EP-SVC-" + strings.Repeat("X", 22)})
		},
		buildErr: "length 29",
	}, {
		name: "a jump to a bad name is refused",
		build: func(tx *xtables.Transaction[*unitID]) {
			tx.Declare(testUnit, svcs)
			tx.Add(testUnit, svcs, &xtables.Rule{Target: xtables.JumpTo("EP SVC")})
		},
		buildErr: "not a valid iptables chain name",
	}, {
		name: "a comment with a quote is refused",
		build: func(tx *xtables.Transaction[*unitID]) {
			tx.Declare(testUnit, svcs)
			tx.Add(testUnit, svcs, &xtables.Rule{Comment: `a"b`, Target: xtables.Return})
		},
		buildErr: "comment",
	}, {
		name: "a probability out of range is refused",
		build: func(tx *xtables.Transaction[*unitID]) {
			tx.Declare(testUnit, svcA)
			tx.Add(testUnit, svcA, &xtables.Rule{Matches: []xtables.Match{xtables.Probability(1.5)}, Target: xtables.Return})
		},
		buildErr: "probability",
	}, {
		name:     "insert into one of our chains is refused",
		build:    func(tx *xtables.Transaction[*unitID]) { tx.Insert(svcs, &toA) },
		buildErr: "not a built-in chain",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			k := state()
			before := k.Dump()
			tx := newTransaction()
			tc.build(tx)
			text, _, err := tx.Render()
			if tc.buildErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.buildErr) {
					t.Fatalf("render error = %v, want one containing %q", err, tc.buildErr)
				}
				if !strings.HasPrefix(tx.String(), "invalid transaction: ") {
					t.Fatalf("String() of a refused transaction = %q", tx.String())
				}
				return
			}
			if tx.String() != string(text) {
				t.Fatalf("String() = %q, render = %q", tx.String(), text)
			}
			if err != nil {
				t.Fatal(err)
			}
			err = k.RestoreNoFlush(context.Background(), text)
			if tc.applyErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.applyErr) {
					t.Fatalf("apply error = %v, want one containing %q", err, tc.applyErr)
				}
				if k.Dump() != before {
					t.Fatalf("a failed transaction changed the tables:\n%s", k.Dump())
				}
				return
			}
			if err != nil {
				t.Fatalf("%v\n%s", err, text)
			}
			for _, w := range tc.want {
				if !strings.Contains(k.Dump(), w) {
					t.Errorf("dump lacks %q:\n%s", w, k.Dump())
				}
			}
		})
	}
}

// The argv for go-iptables and the restore text come from one value.
func TestRuleArgsAndText(t *testing.T) {
	r := xtables.Rule{Matches: []xtables.Match{xtables.CtState("NEW")}, Comment: "edgeproxy service portals", Target: xtables.JumpTo(chainServices)}
	want := []string{"-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "edgeproxy service portals", "-j", "EP-SERVICES"}
	if got := r.Args(); !slices.Equal(got, want) {
		t.Errorf("args = %q, want %q", got, want)
	}
	if got, want := r.Text(), `-m conntrack --ctstate NEW -m comment --comment "edgeproxy service portals" -j EP-SERVICES`; got != want {
		t.Errorf("text = %s, want %s", got, want)
	}
}

// TestSyncsLikeFull: after each step of partial and compare-all syncs,
// the tables hold exactly what one full sync of the same plan writes to
// empty tables; a one-endpoint change writes a few rules only.
func TestSyncsLikeFull(t *testing.T) {
	cfg := Config{Family: datapath.IPv4, MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
	fs := samplePlan()
	set := func(service string, f func(*datapath.Frontend)) {
		for i := range fs {
			if fs[i].Service == SPN(service) {
				f(&fs[i])
			}
		}
	}
	k := xtables.NewFake()
	f := newFakeFamily(cfg, k)
	apply := func(t *testing.T, f *family, plan *datapath.Plan, mode syncMode) applyStats {
		t.Helper()
		st, err := f.apply(context.Background(), plan, mode)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	apply(t, f, &datapath.Plan{Frontends: fs, Full: true}, modeRewrite)
	for _, step := range []struct {
		name     string
		change   func()
		changed  []string
		compare  bool // plan.Full: compare all, trust no Changed
		maxBytes int  // of the restore, 0: any
	}{
		{"one endpoint fewer", func() { set("default/sticky:", func(f *datapath.Frontend) { f.Endpoints = f.Endpoints[:1] }) }, []string{"default/sticky:"}, false, 600},
		{"a service added", func() {
			fs = append(fs, datapath.Frontend{Service: datapath.ServicePortName{Namespace: "default", Name: "new"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: netip.MustParseAddr("10.96.9.9"), Family: datapath.IPv4, Port: 80,
				Endpoints: []datapath.Endpoint{ep("10.244.0.9:80", 1, true)}})
		}, []string{"default/new:"}, false, 0},
		{"a service removed", func() {
			fs = slices.DeleteFunc(fs, func(f datapath.Frontend) bool {
				return f.Service == (datapath.ServicePortName{Namespace: "edge", Name: "lb", Port: "https"})
			})
		}, []string{"edge/lb:https"}, false, 0},
		{"a change missed by Changed, found by compare-all", func() {
			set("default/web:http", func(f *datapath.Frontend) { f.Endpoints = f.Endpoints[1:] })
		}, nil, true, 0},
		{"a local endpoint added (hairpin)", func() {
			set("default/dns:dns", func(f *datapath.Frontend) { f.Endpoints[1].Local = true })
		}, []string{"default/dns:dns"}, false, 0},
		{"a health check port (fixed chains only)", func() { f.cfg.HealthCheckPorts = []uint16{31000} }, []string{}, false, 0},
		{"nothing changed", func() {}, []string{}, false, len(emptyRestore)},
	} {
		t.Run(step.name, func(t *testing.T) {
			step.change()
			plan := &datapath.Plan{Frontends: slices.Clone(fs), Full: step.compare}
			if !step.compare {
				plan.Changed = map[datapath.ServicePortName]bool{}
				for _, s := range step.changed {
					plan.Changed[SPN(s)] = true
				}
			}
			mode := modePartial
			if step.compare {
				mode = modeCompare
			}
			st := apply(t, f, plan, mode)
			if step.maxBytes > 0 && st.bytes > step.maxBytes {
				t.Errorf("restore of %d bytes, want at most %d", st.bytes, step.maxBytes)
			}
			fresh := xtables.NewFake()
			apply(t, newFakeFamily(f.cfg, fresh), &datapath.Plan{Frontends: slices.Clone(fs), Full: true}, modeRewrite)
			if got, want := k.Dump(), fresh.Dump(); got != want {
				t.Fatalf("tables after the sync differ from a full sync of the plan:\n--- got\n%s\n--- want\n%s", got, want)
			}
		})
	}
}

// TestSyncDropsRefusedUnit: when the tables refuse a line of one unit in a
// partial sync, that unit is left out, the error names its service, and
// the tables hold what a full sync of the plan without it writes.
func TestSyncDropsRefusedUnit(t *testing.T) {
	cfg := Config{Family: datapath.IPv4, MasqueradeBit: 14}
	fs := samplePlan()
	k := xtables.NewFake()
	f := newFakeFamily(cfg, k)
	if _, err := f.apply(context.Background(), &datapath.Plan{Frontends: fs, Full: true}, modeRewrite); err != nil {
		t.Fatal(err)
	}
	renderHook = func(u *unit) {
		if u.id.service == (datapath.ServicePortName{Namespace: "default", Name: "web", Port: "http"}) && len(u.chains) > 0 {
			u.chains[0].rules = append(u.chains[0].rules, xtables.Rule{Target: xtables.JumpTo("EP-NO-SUCH-CHAIN")})
		}
	}
	defer func() { renderHook = nil }()
	_, err := f.apply(context.Background(), &datapath.Plan{Frontends: fs, Changed: map[datapath.ServicePortName]bool{{Namespace: "default", Name: "web", Port: "http"}: true}}, modePartial)
	var pe *datapath.PortError
	if !errors.As(err, &pe) || pe.Service != (datapath.ServicePortName{Namespace: "default", Name: "web", Port: "http"}) {
		t.Fatalf("apply error = %v, want a PortError for default/web:http", err)
	}
	if f.needFull {
		t.Fatal("a refused unit failed the whole sync")
	}
	renderHook = nil
	fresh := xtables.NewFake()
	without := slices.DeleteFunc(slices.Clone(fs), func(f datapath.Frontend) bool {
		return f.Service == (datapath.ServicePortName{Namespace: "default", Name: "web", Port: "http"})
	})
	if _, err := newFakeFamily(cfg, fresh).apply(context.Background(), &datapath.Plan{Frontends: without, Full: true}, modeRewrite); err != nil {
		t.Fatal(err)
	}
	if got, want := k.Dump(), fresh.Dump(); got != want {
		t.Fatalf("tables after the refused unit differ from a full sync without it:\n--- got\n%s\n--- want\n%s", got, want)
	}
}

// TestRewriteRenderErrorWritesNothing: a rewrite starts its
// iptables-restore before the render; when the input cannot be rendered
// (an object no unit is to blame for is refused), that restore is aborted
// with nothing written, and the tables keep the rules they had.
func TestRewriteRenderErrorWritesNothing(t *testing.T) {
	cfg := Config{Family: datapath.IPv4, MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
	k := xtables.NewFake()
	f := newFakeFamily(cfg, k)
	plan := &datapath.Plan{Frontends: samplePlan(), Full: true}
	if _, err := f.apply(context.Background(), plan, modeRewrite); err != nil {
		t.Fatal(err)
	}
	before, restores := k.Dump(), k.Restores
	// A fixed rule that cannot be rendered: a pod interface that is no
	// interface name.
	f.cfg.PodInterface = "a/b"
	_, err := f.apply(context.Background(), plan, modeRewrite)
	if err == nil {
		t.Fatal("a rewrite whose fixed rules cannot be rendered succeeded")
	}
	if k.Aborted != 1 || k.Restores != restores {
		t.Errorf("restores committed %d, aborted %d; want the started one aborted and none committed", k.Restores-restores, k.Aborted)
	}
	if got := k.Dump(); got != before {
		t.Fatalf("tables changed by a rewrite that could not be rendered:\n--- got\n%s\n--- before\n%s", got, before)
	}
	if !f.needFull {
		t.Error("the failed rewrite does not make the next apply a rewrite")
	}
}
