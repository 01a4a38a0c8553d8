package nftables

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// ngMod is the random space of the concatenated-range layout.
const ngMod = 1 << 30

// TestElementOnlyLayoutCost is the experiment behind RATIONALE.md, "Why an
// endpoint change still writes rules": what a transaction costs the kernel
// in a layout where a Service's endpoints are elements of one global data
// map that the Service chain's one rule looks up (dnat ip to KEY map
// @endpoints), against a table of N Services × 10 endpoints, medians of 9
// batches. It asserts nothing and runs only when asked:
//
//	EDGEPROXY_NFT_LAYOUT=hash|rbtree|pipapo EDGEPROXY_NFT_LAYOUT_SERVICES=5000 \
//	  go test -run TestElementOnlyLayoutCost -v ./datapath/nftables
//
// hash: key daddr . proto . dport . numgen random mod 16 (16 slots per
// Service); rbtree: key numgen random mod 65536 offset (Service << 17), one
// interval per endpoint; pipapo: key daddr . proto . dport . numgen random
// mod 2^30, one concatenated range per endpoint. EDGEPROXY_NFT_LAYOUT_LIST=1
// also lists the table with Debian's nft and reloads the listing.
func TestElementOnlyLayoutCost(t *testing.T) {
	layout := os.Getenv("EDGEPROXY_NFT_LAYOUT")
	n, _ := strconv.Atoi(os.Getenv("EDGEPROXY_NFT_LAYOUT_SERVICES"))
	if layout == "" || n <= 0 {
		t.Skip("a measurement for RATIONALE.md, not a test: set EDGEPROXY_NFT_LAYOUT and EDGEPROXY_NFT_LAYOUT_SERVICES to run it")
	}
	kernel(t)
	interval := layout != "hash"
	one := layout == "rbtree"
	ns := netns.New(t, "nftlayout")
	c, err := nftables.New(nftables.WithNetNSFd(int(ns.Handle())))
	if err != nil {
		t.Fatal(err)
	}
	tb := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "layout"})
	disp := &nftables.Set{Table: tb, Name: "service-ips", IsMap: true, Concatenation: true, DataType: nftables.TypeVerdict,
		KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService)}
	keyT := []nftables.SetDatatype{nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeMark}
	eps := &nftables.Set{Table: tb, Name: "endpoints", IsMap: true, Concatenation: true, Interval: interval,
		KeyType: nftables.MustConcatSetType(keyT...), DataType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetService)}
	if one {
		eps = &nftables.Set{Table: tb, Name: "endpoints", IsMap: true, Interval: true,
			KeyType: nftables.TypeInteger, KeyByteOrder: binaryutil.BigEndian, DataType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetService)}
	}
	if err := c.AddSet(disp, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.AddSet(eps, nil); err != nil {
		t.Fatal(err)
	}
	svcs := c.AddChain(&nftables.Chain{Table: tb, Name: "services"})
	for _, h := range []*nftables.ChainHook{nftables.ChainHookPrerouting, nftables.ChainHookOutput} {
		b := c.AddChain(&nftables.Chain{Table: tb, Name: fmt.Sprint("nat-", *h), Type: nftables.ChainTypeNAT, Hooknum: h, Priority: nftables.ChainPriorityNATDest})
		c.AddRule(&nftables.Rule{Table: tb, Chain: b, Exprs: []expr.Any{verdict(expr.VerdictJump, "services")}})
	}
	c.AddRule(&nftables.Rule{Table: tb, Chain: svcs, Exprs: dispatchExprs(famIPv4, true, "service-ips")})
	mod := uint32(ngMod)
	if !interval {
		mod = 16
	}
	svcRule := func() []expr.Any {
		if one {
			return []expr.Any{
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{6}},
				&expr.Numgen{Register: reg1, Modulus: 1 << 16, Type: unix.NFT_NG_RANDOM, Offset: 0x10000},
				&expr.Byteorder{SourceRegister: reg1, DestRegister: reg1, Op: expr.ByteorderHton, Len: 4, Size: 4},
				&expr.Lookup{SourceRegister: reg1, DestRegister: reg1, IsDestRegSet: true, SetName: "endpoints"},
				&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: reg1, RegProtoMin: reg32 + 1, Specified: true},
			}
		}
		regs := concatRegs(4, 1, 2, 4)
		return []expr.Any{
			loadAddr(famIPv4, true, regs[0]),
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: regs[1]},
			&expr.Payload{DestRegister: regs[2], Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Numgen{Register: regs[3], Modulus: mod, Type: unix.NFT_NG_RANDOM},
			&expr.Lookup{SourceRegister: reg1, DestRegister: reg1, IsDestRegSet: true, SetName: "endpoints"},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: reg1, RegProtoMin: reg32 + 1, Specified: true},
		}
	}
	vip := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}) }
	epAddr := func(i, j, gen int) netip.Addr {
		return netip.AddrFrom4([4]byte{10, byte(100 + gen), byte(i >> 8), byte(i)})
	}
	key := func(i int, v uint32) []byte {
		if one {
			return binaryutil.BigEndian.PutUint32(uint32(i)<<17 + v>>14)
		}
		b := []byte(keyAddrProtoPort(vip(i), datapath.TCP, 80))
		return binary.BigEndian.AppendUint32(b, v)
	}
	// elements of service i with k endpoints: each owns an equal range.
	elems := func(i, k, gen int) []nftables.SetElement {
		var out []nftables.SetElement
		if !interval {
			for s := range 16 {
				e := epAddr(i, s%k, gen+s%k)
				out = append(out, nftables.SetElement{Key: key(i, uint32(s)), Val: append(e.AsSlice(), 0x1f, 0x90, 0, 0)})
			}
			return out
		}
		step := uint32(ngMod / k)
		for j := range k {
			lo, hi := uint32(j)*step, uint32(j+1)*step-1
			if j == k-1 {
				hi = ngMod - 1
			}
			e := epAddr(i, j, gen+j)
			if one {
				out = append(out, nftables.SetElement{Key: key(i, lo), Val: append(e.AsSlice(), 0x1f, 0x90, 0, 0)},
					nftables.SetElement{Key: key(i, hi+1), IntervalEnd: true})
				continue
			}
			out = append(out, nftables.SetElement{Key: key(i, lo), KeyEnd: key(i, hi), Val: append(e.AsSlice(), 0x1f, 0x90, 0, 0)})
		}
		return out
	}
	start := time.Now()
	for i := range n {
		ch := c.AddChain(&nftables.Chain{Table: tb, Name: fmt.Sprintf("svc-%d", i)})
		c.AddRule(&nftables.Rule{Table: tb, Chain: ch, Exprs: svcRule()})
		if err := c.SetAddElements(disp, []nftables.SetElement{{Key: []byte(keyAddrProtoPort(vip(i), datapath.TCP, 80)),
			VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: ch.Name}}}); err != nil {
			t.Fatal(err)
		}
		if err := c.SetAddElements(eps, elems(i, 10, 0)); err != nil {
			t.Fatal(err)
		}
		if i%500 == 499 {
			if err := c.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Logf("n=%d interval=%v built in %v", n, interval, time.Since(start))
	med := func(name string, fn func(k int)) {
		var ds []time.Duration
		for k := range 9 {
			fn(k)
			s := time.Now()
			if err := c.Flush(); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			ds = append(ds, time.Since(s))
		}
		slices.Sort(ds)
		t.Logf("n=%d %-44s median %8v  min %8v  max %8v", n, name, ds[4], ds[0], ds[8])
	}
	svc := n / 2
	cur := 0
	med("replace one endpoint (1 element del+add)", func(k int) {
		old := elems(svc, 10, cur)
		cur++
		nu := elems(svc, 10, cur)
		lo, hi := 3, 4
		if one {
			lo, hi = 6, 7 // the start element; its end stays
		}
		if err := c.SetDeleteElements(eps, old[lo:hi]); err != nil {
			t.Fatal(err)
		}
		if err := c.SetAddElements(eps, nu[lo:hi]); err != nil {
			t.Fatal(err)
		}
	})
	if !one {
		med("add one element (new key)", func(k int) {
			e := elems(n+100+k, 10, 0)
			if one {
				e = e[2:]
			}
			if err := c.SetAddElements(eps, e[:1]); err != nil {
				t.Fatal(err)
			}
		})
		med("delete one element", func(k int) {
			e := elems(n+100+k, 10, 0)
			if one {
				e = e[2:]
			}
			if err := c.SetDeleteElements(eps, e[:1]); err != nil {
				t.Fatal(err)
			}
		})
	}
	med("add one dispatch verdict elem (goto existing)", func(k int) {
		_ = c.SetAddElements(disp, []nftables.SetElement{{Key: []byte(keyAddrProtoPort(vip(n+200+k), datapath.TCP, 80)),
			VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: "svc-1"}}})
	})
	med("delete one dispatch verdict elem", func(k int) {
		_ = c.SetDeleteElements(disp, []nftables.SetElement{{Key: []byte(keyAddrProtoPort(vip(n+200+k), datapath.TCP, 80))}})
	})
	med("flush a chain of 1 rule", func(k int) {
		c.FlushChain(&nftables.Chain{Table: tb, Name: fmt.Sprintf("svc-%d", k)})
	})
	k := 10
	med("endpoint count 10<->9 (all elements rewritten)", func(_ int) {
		old := elems(svc, k, cur)
		if k == 10 {
			k = 9
		} else {
			k = 10
		}
		cur++
		if err := c.SetDeleteElements(eps, old); err != nil {
			t.Fatal(err)
		}
		if err := c.SetAddElements(eps, elems(svc, k, cur)); err != nil {
			t.Fatal(err)
		}
	})
	med("new chain + 1 rule (today's change)", func(k int) {
		ch := c.AddChain(&nftables.Chain{Table: tb, Name: fmt.Sprintf("new-%d", k)})
		c.AddRule(&nftables.Rule{Table: tb, Chain: ch, Exprs: svcRule()})
	})
	med("new Service: chain, rule, dispatch elem, 10 elems", func(k int) {
		i := n + k
		ch := c.AddChain(&nftables.Chain{Table: tb, Name: fmt.Sprintf("svc-%d", i)})
		c.AddRule(&nftables.Rule{Table: tb, Chain: ch, Exprs: svcRule()})
		_ = c.SetAddElements(disp, []nftables.SetElement{{Key: []byte(keyAddrProtoPort(vip(i), datapath.TCP, 80)),
			VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: ch.Name}}})
		_ = c.SetAddElements(eps, elems(i, 10, 0))
	})
	if os.Getenv("EDGEPROXY_NFT_LAYOUT_LIST") != "" {
		out, err := ns.Run("nft", "list", "chain", "ip", "layout", "svc-0")
		t.Logf("list: %v\n%s", err, out)
		s := time.Now()
		out, err = ns.Run("nft", "list", "ruleset")
		t.Logf("nft list ruleset: %d bytes, %v, err %v", len(out), time.Since(s), err)
		s = time.Now()
		out, err = ns.Run("nft", "-j", "list", "ruleset")
		t.Logf("nft -j list ruleset: %d bytes, %v, err %v", len(out), time.Since(s), err)
		f := t.TempDir() + "/r.nft"
		out, _ = ns.Run("nft", "list", "ruleset")
		if err := os.WriteFile(f, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		ns2 := netns.New(t, "nftlayout2")
		_, err = ns2.Run("nft", "-f", f)
		t.Logf("reload with nft -f: %v", err)
	}
}

// measureLayout runs a layout measurement only when asked: it skips t
// unless EDGEPROXY_NFT_LAYOUT is layout and EDGEPROXY_NFT_LAYOUT_SERVICES
// a positive count, which it returns.
func measureLayout(t *testing.T, layout string) int {
	n, _ := strconv.Atoi(os.Getenv("EDGEPROXY_NFT_LAYOUT_SERVICES"))
	if os.Getenv("EDGEPROXY_NFT_LAYOUT") != layout || n <= 0 {
		t.Skip("a measurement for RATIONALE.md, not a test: set EDGEPROXY_NFT_LAYOUT=" + layout + " and EDGEPROXY_NFT_LAYOUT_SERVICES to run it")
	}
	kernel(t)
	return n
}

// TestSlotLayoutCost measures the layout RATIONALE.md sketches ("What
// does read back"): each Service chain keeps its numgen cascade of 10
// rules, and rule i takes its endpoint's address from map ep-I, keyed by
// the frontend (daddr . proto . dport), the port in the rule; so a
// replaced endpoint is one element of one map. Built in one batch; then
// single batches, medians of 9, against the rewrite of a chain's 10 rules
// (today's change) in the same table. Opt-in like
// TestElementOnlyLayoutCost: EDGEPROXY_NFT_LAYOUT=slots (and
// EDGEPROXY_NFT_LAYOUT_ORDERED=1 to add the elements after every rule).
func TestSlotLayoutCost(t *testing.T) {
	n := measureLayout(t, "slots")
	const k = 10
	ns := netns.New(t, "nftslots")
	c, err := nftables.New(nftables.WithNetNSFd(int(ns.Handle())))
	if err != nil {
		t.Fatal(err)
	}
	tb := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "slots"})
	disp := &nftables.Set{Table: tb, Name: "service-ips", IsMap: true, Concatenation: true, DataType: nftables.TypeVerdict,
		KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService)}
	if err := c.AddSet(disp, nil); err != nil {
		t.Fatal(err)
	}
	slot := make([]*nftables.Set, k)
	for i := range slot {
		slot[i] = &nftables.Set{Table: tb, Name: fmt.Sprintf("ep-%d", i), IsMap: true, Concatenation: true, DataType: nftables.TypeIPAddr,
			KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService)}
		if err := c.AddSet(slot[i], nil); err != nil {
			t.Fatal(err)
		}
	}
	svcs := c.AddChain(&nftables.Chain{Table: tb, Name: "services"})
	for _, h := range []*nftables.ChainHook{nftables.ChainHookPrerouting, nftables.ChainHookOutput} {
		b := c.AddChain(&nftables.Chain{Table: tb, Name: fmt.Sprint("nat-", *h), Type: nftables.ChainTypeNAT, Hooknum: h, Priority: nftables.ChainPriorityNATDest})
		c.AddRule(&nftables.Rule{Table: tb, Chain: b, Exprs: []expr.Any{verdict(expr.VerdictJump, "services")}})
	}
	c.AddRule(&nftables.Rule{Table: tb, Chain: svcs, Exprs: dispatchExprs(famIPv4, true, "service-ips")})
	// rule i of the cascade: numgen random mod (k-i) 0, then the address
	// from ep-i, the port 8080.
	cascadeRule := func(i int) []expr.Any {
		var ex []expr.Any
		if i < k-1 {
			ex = append(ex, &expr.Numgen{Register: reg1, Modulus: uint32(k - i), Type: unix.NFT_NG_RANDOM},
				&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: hostU32(0)})
		}
		regs := concatRegs(4, 1, 2)
		return append(ex,
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.IPPROTO_TCP}},
			loadAddr(famIPv4, true, regs[0]),
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: regs[1]},
			&expr.Payload{DestRegister: regs[2], Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: reg1, DestRegister: reg1, IsDestRegSet: true, SetName: slot[i].Name},
			&expr.Immediate{Register: reg2, Data: []byte{0x1f, 0x90}},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: reg1, RegProtoMin: reg2, Specified: true})
	}
	vip := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}) }
	key := func(i int) []byte { return []byte(keyAddrProtoPort(vip(i), datapath.TCP, 80)) }
	ep := func(i, j, gen int) []byte { return []byte{10, byte(100 + (gen+j)%100), byte(i >> 8), byte(i)} }
	// A rule that looks a map up makes the kernel check every element of
	// the map as it binds (nf_tables_bind_set): in one batch, the
	// elements go after all the rules (ordered) or with each Service.
	ordered := os.Getenv("EDGEPROXY_NFT_LAYOUT_ORDERED") != ""
	addElems := func(i int) {
		for j := range k {
			if err := c.SetAddElements(slot[j], []nftables.SetElement{{Key: key(i), Val: ep(i, j, 0)}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	addService := func(i int, name string) {
		ch := c.AddChain(&nftables.Chain{Table: tb, Name: name})
		for j := range k {
			c.AddRule(&nftables.Rule{Table: tb, Chain: ch, Exprs: cascadeRule(j)})
		}
		if !ordered {
			addElems(i)
		}
		if err := c.SetAddElements(disp, []nftables.SetElement{{Key: key(i), VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: name}}}); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	for i := range n {
		addService(i, fmt.Sprintf("svc-%d", i))
	}
	if ordered {
		for i := range n {
			addElems(i)
		}
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Logf("n=%d slots: built in one batch (elements last: %v) in %v", n, ordered, time.Since(start))
	med := func(name string, fn func(r int)) {
		var ds []time.Duration
		for r := range 9 {
			fn(r)
			s := time.Now()
			if err := c.Flush(); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			ds = append(ds, time.Since(s))
		}
		slices.Sort(ds)
		t.Logf("n=%d %-44s median %8v  min %8v  max %8v", n, name, ds[4], ds[0], ds[8])
	}
	svc := n / 2
	med("replace one endpoint (ep-3 element del+add)", func(r int) {
		if err := c.SetDeleteElements(slot[3], []nftables.SetElement{{Key: key(svc)}}); err != nil {
			t.Fatal(err)
		}
		if err := c.SetAddElements(slot[3], []nftables.SetElement{{Key: key(svc), Val: ep(svc, 3, r+1)}}); err != nil {
			t.Fatal(err)
		}
	})
	med("rewrite a chain's 10 rules (today's change)", func(r int) {
		ch := &nftables.Chain{Table: tb, Name: fmt.Sprintf("svc-%d", svc+1)}
		c.FlushChain(ch)
		for j := range k {
			c.AddRule(&nftables.Rule{Table: tb, Chain: ch, Exprs: cascadeRule(j)})
		}
	})
	if os.Getenv("EDGEPROXY_NFT_LAYOUT_LIST") != "" {
		out, err := ns.Run("nft", "list", "chain", "ip", "slots", "svc-0")
		t.Logf("nft list chain: %v\n%s", err, out)
		rs, err := ns.Run("nft", "list", "ruleset")
		if err != nil {
			t.Fatal(err)
		}
		js, err := ns.Run("nft", "-j", "list", "ruleset")
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		for _, f := range []struct{ name, body string }{{"r.nft", rs}, {"r.json", string(chainsFirst(t, js))}} {
			p := dir + "/" + f.name
			if err := os.WriteFile(p, []byte(f.body), 0o644); err != nil {
				t.Fatal(err)
			}
			back := netns.New(t, "nftslots2")
			args := []string{"-f", p}
			if f.name == "r.json" {
				args = []string{"-j", "-f", p}
			}
			_, err := back.Run("nft", args...)
			got, _ := back.Run("nft", "list", "ruleset")
			t.Logf("%s loaded back: err %v, lists the same: %v", f.name, err, canonical(normalize(got)) == canonical(normalize(rs)))
		}
	}
}

// TestServiceMapLayoutCost is the experiment behind RATIONALE.md, "What a
// cold start costs the kernel, and why a map per Service": N Services × 10
// endpoints loaded into 16 tables (a dispatch verdict map reached from the
// nat prerouting and output base chains, written last) in batches of
// 2,000 messages, three rounds, once with the first build's cascade (ten
// rules of numgen, meta l4proto, dnat per Service) and once with one rule
// per Service looking its endpoint up in an anonymous map of its own
// (meta l4proto tcp dnat ip to numgen random mod 10 map { 0 : A . P, … },
// what the datapath writes now: ruleDNATMap). It
// asserts nothing and runs only when asked:
//
//	EDGEPROXY_NFT_LAYOUT=servicemap EDGEPROXY_NFT_LAYOUT_SERVICES=5000 \
//	  go test -run TestServiceMapLayoutCost -v ./datapath/nftables
//
// EDGEPROXY_NFT_LAYOUT_LIST=1 also lists one Service chain of each layout
// with Debian's nft.
func TestServiceMapLayoutCost(t *testing.T) {
	n := measureLayout(t, "servicemap")
	const shards = 16
	for round := 0; round < 3; round++ {
		for _, layout := range []string{"cascade", "servicemap"} {
			ns := netns.New(t, "nftsvcmap")
			c, err := nftables.New(nftables.WithNetNSFd(int(ns.Handle())))
			if err != nil {
				t.Fatal(err)
			}
			type sh struct {
				tb   *nftables.Table
				disp *nftables.Set
			}
			var shs []sh
			for s := range shards {
				tb := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: fmt.Sprintf("svcmap-%d", s)})
				disp := &nftables.Set{Table: tb, Name: "dispatch", IsMap: true, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict}
				if err := c.AddSet(disp, nil); err != nil {
					t.Fatal(err)
				}
				shs = append(shs, sh{tb, disp})
			}
			if err := c.Flush(); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			msgs := 0
			flush := func() {
				if err := c.Flush(); err != nil {
					t.Fatal(layout, err)
				}
				msgs = 0
			}
			for i := range n {
				s := shs[i%shards]
				ch := c.AddChain(&nftables.Chain{Table: s.tb, Name: fmt.Sprintf("svc-%05d", i)})
				msgs++
				ep := func(j int) (ip []byte, port []byte) {
					k := i*10 + j
					return []byte{10, 128 + byte(k>>16), byte(k >> 8), byte(k)}, []byte{0x1f, 0x90}
				}
				switch layout {
				case "cascade":
					for j := range 10 {
						ip, port := ep(j)
						var ex []expr.Any
						if j < 9 {
							ex = append(ex, &expr.Numgen{Register: 1, Modulus: uint32(10 - j), Type: unix.NFT_NG_RANDOM},
								&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0, 0, 0, 0}})
						}
						ex = append(ex, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{6}},
							&expr.Immediate{Register: 1, Data: ip}, &expr.Immediate{Register: 2, Data: port},
							&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true})
						c.AddRule(&nftables.Rule{Table: s.tb, Chain: ch, Exprs: ex})
						msgs++
					}
				case "servicemap":
					set := &nftables.Set{Table: s.tb, Anonymous: true, Constant: true, IsMap: true, KeyType: nftables.TypeInteger,
						DataType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetService)}
					var els []nftables.SetElement
					for j := range 10 {
						ip, port := ep(j)
						key := make([]byte, 4)
						binary.BigEndian.PutUint32(key, uint32(j))
						els = append(els, nftables.SetElement{Key: key, Val: append(append(ip, port...), 0, 0)})
					}
					if err := c.AddSet(set, els); err != nil {
						t.Fatal(err)
					}
					msgs += 2
					c.AddRule(&nftables.Rule{Table: s.tb, Chain: ch, Exprs: []expr.Any{
						&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{6}},
						&expr.Numgen{Register: 1, Modulus: 10, Type: unix.NFT_NG_RANDOM},
						&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 4, Size: 4},
						&expr.Lookup{SourceRegister: 1, DestRegister: 1, IsDestRegSet: true, SetID: set.ID, SetName: set.Name},
						&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 9, Specified: true},
					}})
					msgs++
				}
				vip := []byte{10, 96, byte(i >> 8), byte(i)}
				if err := c.SetAddElements(s.disp, []nftables.SetElement{{Key: vip, VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: ch.Name}}}); err != nil {
					t.Fatal(err)
				}
				msgs++
				if msgs >= 2000 {
					flush()
				}
			}
			// The base chains last, as the Proxier writes them, in the
			// batch with what is left.
			for _, s := range shs {
				for name, hook := range map[string]*nftables.ChainHook{"nat-prerouting": nftables.ChainHookPrerouting, "nat-output": nftables.ChainHookOutput} {
					bc := c.AddChain(&nftables.Chain{Table: s.tb, Name: name, Type: nftables.ChainTypeNAT, Hooknum: hook, Priority: nftables.ChainPriorityNATDest})
					c.AddRule(&nftables.Rule{Table: s.tb, Chain: bc, Exprs: []expr.Any{
						&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
						&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: s.disp.Name, SetID: s.disp.ID},
					}})
				}
			}
			flush()
			d := time.Since(start)
			t.Logf("%-8s n=%d %v", layout, n, d.Round(time.Millisecond))
			if round == 0 && os.Getenv("EDGEPROXY_NFT_LAYOUT_LIST") != "" {
				out, err := ns.Run("nft", "list", "chain", "ip", "svcmap-3", "svc-00003")
				t.Logf("%s (err %v)", out, err)
			}
			c.FlushRuleset() // the namespace stays until the test ends
			flush()
		}
	}
}
