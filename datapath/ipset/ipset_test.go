package ipset

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

func ap(s string) netip.Addr   { return netip.MustParseAddr(s) }
func pf(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func sortedList(es []Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.String())
	}
	slices.Sort(out)
	return out
}

// kernelNS gives the test a fresh network namespace; ipsets are per
// namespace, so nothing touches the host's sets.
func kernelNS(t *testing.T) *netns.NS {
	t.Helper()
	gate.Root(t)
	return netns.New(t, "ipset")
}

func TestSyncDiffsEntries(t *testing.T) {
	ns := kernelNS(t)
	k := Netlink{}
	set := Set{Name: "EP-TEST-CLUSTER-IP", Type: HashIPPort, Family: datapath.IPv4}
	e := func(a string, p datapath.Protocol, port uint16) Entry {
		return Entry{Addr: ap(a), Protocol: p, Port: port}
	}
	steps := []struct {
		entries []Entry
		want    Stats
	}{
		{[]Entry{e("10.96.0.1", datapath.TCP, 443), e("10.96.0.10", datapath.UDP, 53), e("10.96.0.10", datapath.TCP, 53)}, Stats{Created: 1, Added: 3}},
		{[]Entry{e("10.96.0.1", datapath.TCP, 443), e("10.96.0.10", datapath.UDP, 53), e("10.96.0.10", datapath.TCP, 53)}, Stats{}},
		{[]Entry{e("10.96.0.1", datapath.TCP, 443), e("10.96.0.10", datapath.UDP, 53), e("10.96.0.11", datapath.TCP, 80)}, Stats{Added: 1, Deleted: 1}},
		{nil, Stats{Deleted: 3}},
	}
	for i, s := range steps {
		err := ns.Do(func() error {
			st, err := Sync(k, set, s.entries)
			if err != nil {
				return err
			}
			if st != s.want {
				t.Errorf("step %d: stats %+v, want %+v", i, st, s.want)
			}
			if held, err := Holds(k, set, s.entries); !held || err != nil {
				t.Errorf("step %d: Holds after Sync = %v, %v; want true", i, held, err)
			}
			if held, _ := Holds(k, set, append(slices.Clone(s.entries), e("10.96.0.99", datapath.TCP, 1))); held {
				t.Errorf("step %d: Holds with an entry the kernel lacks = true", i)
			}
			got, es, ok, err := k.Get(set.Name)
			if err != nil || !ok {
				t.Fatalf("step %d: get: ok=%v err=%v", i, ok, err)
			}
			if got.Type != set.Type || got.Family != set.Family {
				t.Errorf("step %d: kernel set is %v, want %v", i, got, set)
			}
			if g, w := sortedList(es), sortedList(s.entries); !slices.Equal(g, w) {
				t.Errorf("step %d: kernel entries %v, want %v", i, g, w)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
}

func TestSyncEveryType(t *testing.T) {
	ns := kernelNS(t)
	k := Netlink{}
	cases := []struct {
		set     Set
		entries []Entry
	}{
		{Set{"EP-T-IP", HashIP, datapath.IPv4}, []Entry{{Addr: ap("10.0.0.1")}, {Addr: ap("10.0.0.2")}}},
		{Set{"EP-T-NET", HashNet, datapath.IPv4}, []Entry{{Net: pf("10.0.0.0/8")}, {Net: pf("192.168.1.0/24")}}},
		{Set{"EP-T-IPPORTIP", HashIPPortIP, datapath.IPv4}, []Entry{{Addr: ap("10.244.0.5"), Protocol: datapath.TCP, Port: 80, Addr2: ap("10.244.0.5")}}},
		{Set{"EP-T-IPPORTNET", HashIPPortNet, datapath.IPv4}, []Entry{{Addr: ap("203.0.113.7"), Protocol: datapath.TCP, Port: 80, Net: pf("198.51.100.0/24")}}},
		{Set{"EP-T-NODEPORT-TCP", BitmapPort, 0}, []Entry{{Port: 30080}, {Port: 31000}}},
		{Set{"EP-T-IP6", HashIPPort, datapath.IPv6}, []Entry{{Addr: ap("fd00::1"), Protocol: datapath.UDP, Port: 53}}},
	}
	for _, c := range cases {
		t.Run(c.set.Name, func(t *testing.T) {
			err := ns.Do(func() error {
				if _, err := Sync(k, c.set, c.entries); err != nil {
					return err
				}
				st, err := Sync(k, c.set, c.entries)
				if err != nil {
					return err
				}
				if st != (Stats{}) {
					t.Errorf("second sync changed %+v; entries do not round-trip", st)
				}
				_, es, _, err := k.Get(c.set.Name)
				if g, w := sortedList(es), sortedList(c.entries); !slices.Equal(g, w) {
					t.Errorf("kernel entries %v, want %v", g, w)
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestSyncReplacesSetOfAnotherType(t *testing.T) {
	ns := kernelNS(t)
	k := Netlink{}
	err := ns.Do(func() error {
		// An older version left a hash:ip under the name.
		if _, err := Sync(k, Set{"EP-T-LB", HashIP, datapath.IPv4}, []Entry{{Addr: ap("10.0.0.1")}}); err != nil {
			return err
		}
		want := Set{"EP-T-LB", HashIPPort, datapath.IPv4}
		entries := []Entry{{Addr: ap("203.0.113.1"), Protocol: datapath.TCP, Port: 80}}
		st, err := Sync(k, want, entries)
		if err != nil {
			return err
		}
		if st.Replaced != 1 {
			t.Errorf("stats %+v, want one replacement", st)
		}
		got, es, _, err := k.Get(want.Name)
		if err != nil {
			return err
		}
		if got.Type != HashIPPort || !slices.Equal(sortedList(es), sortedList(entries)) {
			t.Errorf("after replace: %v %v", got, es)
		}
		names, err := k.Names()
		if err != nil {
			return err
		}
		if !slices.Equal(names, []string{"EP-T-LB"}) {
			t.Errorf("sets left: %v, want only EP-T-LB", names)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestReplaceInUseSetReportsErrInUse(t *testing.T) {
	ns := kernelNS(t)
	gate.Binaries(t, "iptables")
	k := Netlink{}
	if err := ns.Do(func() error {
		_, err := Sync(k, Set{"EP-T-USED", HashIP, datapath.IPv4}, []Entry{{Addr: ap("10.0.0.1")}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if out, err := ns.Run("iptables", "-w", "-A", "INPUT", "-m", "set", "--match-set", "EP-T-USED", "dst", "-j", "ACCEPT"); err != nil {
		t.Fatalf("reference the set: %v %s", err, out)
	}
	err := ns.Do(func() error {
		_, err := Sync(k, Set{"EP-T-USED", HashIPPort, datapath.IPv4}, []Entry{{Addr: ap("10.0.0.1"), Protocol: datapath.TCP, Port: 1}})
		return err
	})
	if !errors.Is(err, ErrInUse) {
		t.Fatalf("replacing a referenced set of another type: err = %v, want ErrInUse", err)
	}
	// The old set is untouched and no temporary set is left over.
	ns.Do(func() error {
		got, _, ok, _ := k.Get("EP-T-USED")
		if !ok || got.Type != HashIP {
			t.Errorf("old set after failed replace: ok=%v %v", ok, got)
		}
		names, _ := k.Names()
		if len(names) != 1 {
			t.Errorf("sets left: %v", names)
		}
		return nil
	})
}

func TestEntryValidation(t *testing.T) {
	_, err := Sync(Netlink{}, Set{"EP-T", HashIPPort, datapath.IPv4}, []Entry{{Addr: ap("fd00::1"), Protocol: datapath.TCP, Port: 80}})
	if err == nil || !strings.Contains(err.Error(), "not IPv4") {
		t.Errorf("IPv6 entry in an IPv4 set: err = %v", err)
	}
	_, err = Sync(Netlink{}, Set{"EP-T", HashIPPort, datapath.IPv4}, []Entry{{Addr: ap("10.0.0.1")}})
	if err == nil {
		t.Error("hash:ip,port entry without a port was accepted")
	}
	_, err = Sync(Netlink{}, Set{strings.Repeat("X", 32), HashIP, datapath.IPv4}, nil)
	if err == nil {
		t.Error("32-character set name was accepted")
	}
}

func TestTempNameFits(t *testing.T) {
	if n := tempName(strings.Repeat("A", 31)); len(n) > MaxNameLen {
		t.Errorf("tempName gives %d characters", len(n))
	}
}
