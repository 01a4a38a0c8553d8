package nftables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables/expr"

	"github.com/edgeproxy/edgeproxy/datapath"
)

func ep(s string, w uint32) datapath.Endpoint {
	return datapath.Endpoint{Addr: netip.MustParseAddrPort(s), Weight: w}
}

// weighted is one endpoint per weight of ws, and the weights' sum.
func weighted(ws []uint32) ([]datapath.Endpoint, float64) {
	var eps []datapath.Endpoint
	sum := 0.0
	for i, w := range ws {
		eps = append(eps, ep("10.244.0."+string(rune('2'+i))+":80", w))
		sum += float64(w)
	}
	return eps, sum
}

// The cascade gives endpoint i the share w_i / Σw exactly: the product of
// the probabilities of passing the rules before it and of matching its
// own, from the moduli and thresholds the rules carry.
func TestCascadeShares(t *testing.T) {
	for _, ws := range [][]uint32{{1}, {1, 1}, {5, 5, 5}, {100, 300, 50}, {1, 2, 3, 4}, {10000, 1}, {7, 7, 14}} {
		eps, sum := weighted(ws)
		rules := cascade(famIPv4, datapath.TCP, eps, 0, nil)
		if len(rules) != len(eps) {
			t.Fatalf("%v: %d rules for %d endpoints", ws, len(rules), len(eps))
		}
		pass := 1.0
		for i, r := range rules {
			var mod, w uint32
			switch {
			case i == len(rules)-1:
				if strings.Contains(r.text, "numgen") {
					t.Fatalf("%v: last rule %q is conditional", ws, r.text)
				}
				mod, w = 1, 1
			case strings.Contains(r.text, " < "):
				mustScan(t, r.text, "numgen random mod %d < %d ", &mod, &w)
			default:
				mustScan(t, r.text, "numgen random mod %d 0 ", &mod)
				w = 1
			}
			share := pass * float64(w) / float64(mod)
			if want := float64(ws[i]) / sum; share < want-1e-9 || share > want+1e-9 {
				t.Errorf("%v: endpoint %d gets %.6f, want %.6f (%q)", ws, i, share, want, r.text)
			}
			pass *= 1 - float64(w)/float64(mod)
		}
	}
}

// The map gives endpoint i the share w_i / Σw exactly too: its range of
// slots, from the map's elements (a start each, and the end after the
// last one in an interval map), over the numgen modulus.
func TestMapShares(t *testing.T) {
	for _, ws := range [][]uint32{{1, 1}, {5, 5, 5}, {100, 300, 50}, {1, 2, 3, 4}, {10000, 1}, {7, 7, 14}} {
		eps, sum := weighted(ws)
		rules := balance(famIPv4, datapath.TCP, eps, 0, nil)
		if len(rules) != 1 || rules[0].anon == nil {
			t.Fatalf("%v: %d rules, want one with a map", ws, len(rules))
		}
		r := rules[0]
		var mod uint32
		for _, e := range r.exprs {
			if ng, ok := e.(*expr.Numgen); ok {
				mod = ng.Modulus
			}
		}
		m := r.anon
		starts := m.elems
		end := mod
		if m.interval {
			last := starts[len(starts)-1]
			if !last.IntervalEnd {
				t.Fatalf("%v: the interval map does not end", ws)
			}
			starts, end = starts[:len(starts)-1], binary.BigEndian.Uint32(last.Key)
		}
		if len(starts) != len(eps) || end != mod {
			t.Fatalf("%v: %d elements ending at %d for %d endpoints, numgen mod %d", ws, len(starts), end, len(eps), mod)
		}
		for i, e := range starts {
			lo, hi := binary.BigEndian.Uint32(e.Key), end
			if i+1 < len(starts) {
				hi = binary.BigEndian.Uint32(starts[i+1].Key)
			}
			if !m.interval && hi-lo != 1 {
				t.Fatalf("%v: a plain map with a slot %d wide", ws, hi-lo)
			}
			if to := netip.AddrFrom4([4]byte(e.Val[:4])); to != eps[i].Addr.Addr() || binary.BigEndian.Uint16(e.Val[4:]) != eps[i].Addr.Port() {
				t.Errorf("%v: slot %d goes to %v, want %v", ws, lo, e.Val, eps[i].Addr)
			}
			share := float64(hi-lo) / float64(mod)
			if want := float64(ws[i]) / sum; share < want-1e-9 || share > want+1e-9 {
				t.Errorf("%v: endpoint %d gets %.6f, want %.6f (%q)", ws, i, share, want, r.text)
			}
		}
	}
}

func mustScan(t *testing.T, s, format string, args ...any) {
	t.Helper()
	if _, err := fmt.Sscanf(s, format, args...); err != nil {
		t.Fatalf("%q does not read as %q: %v", s, format, err)
	}
}

// What the datapath cannot program is left out by name, each service
// port concerned in one PortError; the rest of the plan, that service
// port's other frontends included, is kept.
func TestSupportedLeavesOutUnsupported(t *testing.T) {
	svc, other := datapath.ServicePortName{Namespace: "ns", Name: "a"}, datapath.ServicePortName{Namespace: "ns", Name: "b"}
	ok := datapath.Frontend{Service: svc, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: netip.MustParseAddr("10.96.0.1"), Family: datapath.IPv4, Port: 80, Affinity: time.Hour}
	ok6 := ok
	ok6.Addr, ok6.Family = netip.MustParseAddr("fd00::1"), datapath.IPv6
	if kept, errs := supported([]datapath.Frontend{ok, ok6}); len(kept) != 2 || errs != nil {
		t.Fatalf("ClusterIP with affinity in both families: kept %d, errors %v", len(kept), errs)
	}
	for _, tc := range []struct {
		name string
		mod  func(f *datapath.Frontend)
		want string
	}{
		{"unknown kind", func(f *datapath.Frontend) { f.Kind = "Bogus" }, "frontend kind Bogus"},
		{"unknown protocol", func(f *datapath.Frontend) { f.Protocol = "Bogus" }, "protocol Bogus"},
	} {
		bad := ok
		tc.mod(&bad)
		bad2 := bad
		bad2.Port = 81
		fine := ok
		fine.Service = other
		kept, errs := supported([]datapath.Frontend{ok, bad, fine, bad2})
		if len(kept) != 2 || kept[0].Service != svc || kept[0].Port != 80 || kept[1].Service != other {
			t.Errorf("%s: kept %v, want the two supported frontends", tc.name, kept)
		}
		if len(errs) != 1 {
			t.Fatalf("%s: errors %v, want one for the service port", tc.name, errs)
		}
		ports, rest := datapath.SplitPortErrors(errors.Join(errs...))
		if rest != nil || len(ports) != 1 || ports[0].Service != svc || !errors.Is(errs[0], ErrUnsupported) ||
			!strings.Contains(errs[0].Error(), tc.want) || !strings.Contains(errs[0].Error(), "2 of its frontends") {
			t.Errorf("%s: error %v, want a PortError of %s wrapping ErrUnsupported naming %q and 2 frontends", tc.name, errs[0], svc, tc.want)
		}
	}
}

// A unit's chain names follow the service port, its map keys are each
// field padded to 32 bits (address . protocol . port); frontends without
// endpoints go to the no-endpoint maps (reject, or drop when Drop is set)
// and make no chain. A cluster IP, with or without endpoints, is in the
// cluster-ips set (its other ports are rejected).
func TestBuildUnit(t *testing.T) {
	o := &Options{MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
	svc := datapath.ServicePortName{Namespace: "ns", Name: "a", Port: "http"}
	eps := []datapath.Endpoint{ep("10.244.0.2:8080", 1), ep("10.244.0.3:8080", 1)}
	u, err := buildUnit(famIPv4, o, []datapath.Frontend{
		{Service: svc, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: netip.MustParseAddr("10.96.0.1"), Family: datapath.IPv4, Port: 80, Endpoints: eps},
		{Service: svc, Kind: datapath.NodePort, Protocol: datapath.TCP, Family: datapath.IPv4, Port: 30080, Endpoints: eps},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `chain svc-ns/a/http {
	ip daddr 10.96.0.1 ip saddr != 10.244.0.0/16 meta mark set meta mark | 0x00004000
	meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.244.0.2 . 8080, 1 : 10.244.0.3 . 8080 }
}
chain ext-ns/a/http {
	meta mark set meta mark | 0x00004000
	goto svc-ns/a/http
}
element service-ips 0a6000010600000000500000 : goto svc-ns/a/http
element service-nodeports 0600000075800000 : goto ext-ns/a/http
cluster-ips 10.96.0.1
hairpin 10.244.0.2
hairpin 10.244.0.3
`
	if got := u.String(); got != want {
		t.Errorf("unit:\n%s\nwant:\n%s", got, want)
	}
	u, err = buildUnit(famIPv4, o, []datapath.Frontend{
		{Service: svc, Kind: datapath.ClusterIP, Protocol: datapath.UDP, Addr: netip.MustParseAddr("10.96.0.1"), Family: datapath.IPv4, Port: 53},
		{Service: svc, Kind: datapath.NodePort, Protocol: datapath.UDP, Family: datapath.IPv4, Port: 30053, Drop: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	want = `element no-endpoint-nodeports 1100000075650000 : drop
element no-endpoint-services 0a6000011100000000350000 : goto reject-chain
cluster-ips 10.96.0.1
`
	if got := u.String(); got != want {
		t.Errorf("unit without endpoints:\n%s\nwant:\n%s", got, want)
	}
}

// Traffic policy Local: the external chain short-circuits pods and the
// node to the cluster-wide endpoints (masquerading the node's own
// traffic) and sends the rest to the local ones, keeping the client's
// address; the internal policy Local gives the cluster IP a second
// load-balancing chain. Without local endpoints the frontend is dropped
// in the filter chains, its short-circuit kept.
func TestBuildUnitLocal(t *testing.T) {
	o := &Options{MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
	svc := datapath.ServicePortName{Namespace: "ns", Name: "a"}
	local := []datapath.Endpoint{ep("10.244.0.2:8080", 1)}
	all := []datapath.Endpoint{ep("10.244.0.2:8080", 1), ep("10.244.1.3:8080", 1)}
	np := datapath.Frontend{Service: svc, Kind: datapath.NodePort, Protocol: datapath.TCP, Family: datapath.IPv4, Port: 30080, Endpoints: local, LocalOnly: true, Cluster: all}
	u, err := buildUnit(famIPv4, o, []datapath.Frontend{
		{Service: svc, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: netip.MustParseAddr("10.96.0.1"), Family: datapath.IPv4, Port: 80, Endpoints: all},
		np,
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `chain svc-ns/a {
	ip daddr 10.96.0.1 ip saddr != 10.244.0.0/16 meta mark set meta mark | 0x00004000
	meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.244.0.2 . 8080, 1 : 10.244.1.3 . 8080 }
}
chain svc-ns/a.2 {
	meta l4proto tcp dnat to 10.244.0.2:8080
}
chain ext-ns/a {
	ip saddr 10.244.0.0/16 goto svc-ns/a
	fib saddr type local meta mark set meta mark | 0x00004000
	fib saddr type local goto svc-ns/a
	goto svc-ns/a.2
}
element service-ips 0a6000010600000000500000 : goto svc-ns/a
element service-nodeports 0600000075800000 : goto ext-ns/a
cluster-ips 10.96.0.1
hairpin 10.244.0.2
hairpin 10.244.1.3
`
	if got := u.String(); got != want {
		t.Errorf("unit:\n%s\nwant:\n%s", got, want)
	}
	np.Endpoints, np.Drop = nil, true
	u, err = buildUnit(famIPv4, o, []datapath.Frontend{np})
	if err != nil {
		t.Fatal(err)
	}
	want = `chain svc-ns/a {
	meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.244.0.2 . 8080, 1 : 10.244.1.3 . 8080 }
}
chain ext-ns/a {
	ip saddr 10.244.0.0/16 goto svc-ns/a
	fib saddr type local meta mark set meta mark | 0x00004000
	fib saddr type local goto svc-ns/a
}
element no-endpoint-nodeports 0600000075800000 : drop
element service-nodeports 0600000075800000 : goto ext-ns/a
hairpin 10.244.0.2
hairpin 10.244.1.3
`
	if got := u.String(); got != want {
		t.Errorf("unit without local endpoints:\n%s\nwant:\n%s", got, want)
	}
}

// Source ranges become disjoint intervals of one family: an interval set
// refuses overlapping elements.
func TestDisjoint(t *testing.T) {
	p := netip.MustParsePrefix
	got := disjoint([]netip.Prefix{p("10.1.2.3/32"), p("10.0.0.0/8"), p("192.168.77.9/24"), p("fd00::/64"), p("10.0.0.0/8"), p("192.168.0.0/16")}, datapath.IPv4)
	want := []netip.Prefix{p("10.0.0.0/8"), p("192.168.0.0/16")}
	if !slices.Equal(got, want) {
		t.Errorf("disjoint = %v, want %v", got, want)
	}
	first, last := prefixRange(p("192.168.77.9/24"))
	if first != netip.MustParseAddr("192.168.77.0") || last != netip.MustParseAddr("192.168.77.255") {
		t.Errorf("prefixRange = %s-%s", first, last)
	}
}

func TestNftTime(t *testing.T) {
	for d, want := range map[time.Duration]string{
		3 * time.Hour: "3h", 90 * time.Second: "1m30s", 1500 * time.Millisecond: "1s500ms",
		49 * time.Hour: "2d1h", 0: "0s",
	} {
		if got := nftTime(d); got != want {
			t.Errorf("nftTime(%v) = %q, want %q", d, got, want)
		}
	}
}

// Out-of-window packets are dropped in forward unless conntrack is liberal.
func TestInvalidDrop(t *testing.T) {
	for _, liberal := range []bool{false, true} {
		var forward []string
		for _, c := range famIPv4.fixedChains(&Options{MasqueradeBit: 14, TCPBeLiberal: liberal}, false) {
			if c.name == chainFilterForward {
				for _, r := range c.rules {
					forward = append(forward, r.text)
				}
			}
		}
		if has := slices.Contains(forward, "ct state invalid drop"); has == liberal {
			t.Errorf("TCPBeLiberal %v: filter-forward %q", liberal, forward)
		}
	}
}

// A source range that holds the node's address lets the balancer's own
// address in as a source too (kube-proxy's allowFromNode).
func TestBuildUnitSourceRangesHoldNode(t *testing.T) {
	o := &Options{MasqueradeBit: 14}
	svc := datapath.ServicePortName{Namespace: "ns", Name: "lb", Port: "https"}
	allowed := func(holdsNode bool) []string {
		u, err := buildUnit(famIPv4, o, []datapath.Frontend{{Service: svc, Kind: datapath.LoadBalancer, Protocol: datapath.TCP,
			Addr: netip.MustParseAddr("172.30.0.1"), Family: datapath.IPv4, Port: 443, Endpoints: []datapath.Endpoint{ep("10.244.0.2:8443", 1)},
			SourceRanges: []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24")}, SourceRangesHoldNode: holdsNode}})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, l := range strings.Split(u.String(), "\n") {
			if strings.HasPrefix(l, "element "+setFirewallAllow+" ") {
				out = append(out, l)
			}
		}
		return out
	}
	if got := allowed(false); len(got) != 1 {
		t.Errorf("ranges without the node: %q, want one allowed range", got)
	}
	// Key: daddr . proto . dport, then the source: 172.30.0.1 (ac1e0001).
	if got := allowed(true); len(got) != 2 || !strings.Contains(strings.Join(got, " "), "01bb0000ac1e0001-ac1e00010600000001bb0000ac1e0001") {
		t.Errorf("ranges holding the node: %q, want the range and the source 172.30.0.1 alone", got)
	}
}

// Per-endpoint affinity set names never collide: distinct service ports
// and endpoints give distinct names, whatever their texts hold (an
// unnamed port, an IPv4-mapped address whose text has dots, addresses
// whose texts differ only in where the colons are), and every name is an
// nft identifier (letters, digits, '/', '-', '_', '.').
func TestAffinitySetNamesAreDistinct(t *testing.T) {
	svcs := []datapath.ServicePortName{{Namespace: "ns", Name: "a"}, {Namespace: "ns", Name: "a", Port: "p"}, {Namespace: "ns", Name: "a-p"}, {Namespace: "ns-a", Name: "p"}}
	var eps []netip.AddrPort
	for _, a := range []string{"fd00::1", "fd00::1:0", "::ffff:1.2.3.4", "::ffff:1:2:3:4", "1::2:3", "1:0:0:2::3", "fd00:244::2"} {
		for _, port := range []uint16{80, 8080, 1} {
			eps = append(eps, netip.AddrPortFrom(netip.MustParseAddr(a), port))
		}
	}
	ident := regexp.MustCompile(`^[A-Za-z][A-Za-z0-9/_.-]*$`)
	seen := map[string]string{}
	for _, s := range svcs {
		for _, e := range eps {
			n, who := affinitySetName(s, e), s.String()+" "+e.String()
			if !ident.MatchString(n) {
				t.Errorf("%s: %q is not an nft identifier", who, n)
			}
			if prev, ok := seen[n]; ok {
				t.Errorf("%s and %s share the set name %q", prev, who, n)
			}
			seen[n] = who
		}
	}
}

// A shared element is written as the bytes its set's elements have: the
// address (cluster-ips) or the address twice (hairpin), 4 bytes for IPv4
// and 16 otherwise, an IPv4-mapped IPv6 address included; and shared
// elements sort as their elements do.
func TestSharedElementBytes(t *testing.T) {
	addrs := []string{"10.96.0.10", "10.96.0.9", "0.0.0.0", "255.255.255.255", "fd00::a", "fd00::1", "::ffff:10.96.0.10", "fe80::1%eth0"}
	var all []shared
	for _, s := range addrs {
		a := netip.MustParseAddr(s)
		raw := a.AsSlice()
		for _, c := range []struct {
			set  uint8
			name string
			key  []byte
		}{
			{sharedClusterIPs, setClusterIPs, raw},
			{sharedHairpin, setHairpin, append(slices.Clone(raw), raw...)},
		} {
			k := sharedOf(c.set, a)
			all = append(all, k)
			e := k.elemKey()
			if e.tab != 0 || e.set != c.name || e.key != string(c.key) || e.end != "" {
				t.Errorf("%s in %s: element %+v, want set %s key %x", s, c.name, e, c.name, c.key)
			}
			if k.setName() != c.name || k.address() != a.WithZone("") {
				t.Errorf("%s in %s: reads back as %s in %s", s, c.name, k.address(), k.setName())
			}
		}
	}
	// Within one family (a unit's), the orders agree.
	for _, four := range []bool{true, false} {
		var ks []shared
		for _, k := range all {
			if k.four == four {
				ks = append(ks, k)
			}
		}
		byShared := slices.SortedFunc(slices.Values(ks), shared.compare)
		byElem := slices.SortedFunc(slices.Values(ks), func(a, b shared) int { return a.elemKey().compare(b.elemKey()) })
		if !slices.Equal(byShared, byElem) {
			t.Errorf("four=%v: shared order %v, element order %v", four, byShared, byElem)
		}
	}
}
