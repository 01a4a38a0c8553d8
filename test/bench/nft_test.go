package bench

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
)

// Messages built here have the layout the kernel sends (nf_tables_api.c):
// nfgenmsg, then big-endian attributes, nested where nf_tables nests.

func attrs(t *testing.T, fn func(ae *netlink.AttributeEncoder)) []byte {
	t.Helper()
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	fn(ae)
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func expr(name string, data func(ae *netlink.AttributeEncoder)) func(ae *netlink.AttributeEncoder) {
	return func(ae *netlink.AttributeEncoder) {
		ae.Nested(nftaListElem, func(e *netlink.AttributeEncoder) error {
			e.String(nftaExprName, name)
			e.Nested(nftaExprData, func(d *netlink.AttributeEncoder) error { data(d); return nil })
			return nil
		})
	}
}

func immediate(reg uint32, value []byte) func(ae *netlink.AttributeEncoder) {
	return expr("immediate", func(d *netlink.AttributeEncoder) {
		d.Uint32(nftaImmediateDreg, reg)
		d.Nested(nftaImmediateData, func(v *netlink.AttributeEncoder) error { v.Bytes(nftaDataValue, value); return nil })
	})
}

func natExpr(family, addrReg, protoReg uint32) func(ae *netlink.AttributeEncoder) {
	return expr("nat", func(d *netlink.AttributeEncoder) {
		d.Uint32(nftaNatType, nftNatDNAT)
		d.Uint32(nftaNatFamily, family)
		d.Uint32(nftaNatRegAddrMin, addrReg)
		if protoReg != 0 {
			d.Uint32(nftaNatRegProtoMin, protoReg)
		}
	})
}

func ruleMsg(t *testing.T, family uint8, table, chain string, handle uint64, exprs ...func(ae *netlink.AttributeEncoder)) []byte {
	return append(nfgen(family), attrs(t, func(ae *netlink.AttributeEncoder) {
		ae.String(nftaRuleTable, table)
		ae.String(nftaRuleChain, chain)
		ae.Uint64(nftaRuleHandle, handle)
		ae.Nested(nftaRuleExprs, func(l *netlink.AttributeEncoder) error {
			for _, e := range exprs {
				e(l)
			}
			return nil
		})
	})...)
}

func port(p uint16) []byte { return binary.BigEndian.AppendUint16(nil, p) }

func mustParse(t *testing.T, kind int, data []byte) nftEvent {
	t.Helper()
	ev, ok, err := parseNFT(kind, data)
	if err != nil || !ok {
		t.Fatalf("parse message %d: ok %v err %v", kind, ok, err)
	}
	return ev
}

// A native nat expression reads the registers immediates loaded, in the
// 128-bit (NFT_REG_1) and 32-bit (NFT_REG32_xx) numbering; an expression
// that may have overwritten them in between makes them unknown.
func TestRuleDecoderImmediates(t *testing.T) {
	ip := netip.MustParseAddr("10.128.0.7").As4()
	ip6 := netip.MustParseAddr("fd00::7").As16()
	for _, tc := range []struct {
		name  string
		exprs []func(ae *netlink.AttributeEncoder)
		want  []string
	}{
		{"reg32", []func(ae *netlink.AttributeEncoder){immediate(8, ip[:]), immediate(9, port(8080)), natExpr(nfprotoIPv4, 8, 9)}, []string{"10.128.0.7:8080"}},
		{"reg128", []func(ae *netlink.AttributeEncoder){immediate(1, ip[:]), immediate(2, port(53)), natExpr(nfprotoIPv4, 1, 2)}, []string{"10.128.0.7:53"}},
		{"address only", []func(ae *netlink.AttributeEncoder){immediate(1, ip[:]), natExpr(nfprotoIPv4, 1, 0)}, []string{"10.128.0.7:0"}},
		{"ipv6", []func(ae *netlink.AttributeEncoder){immediate(8, ip6[:]), immediate(12, port(80)), natExpr(nfprotoIPv6, 8, 12)}, []string{"[fd00::7]:80"}},
		{"overwritten", []func(ae *netlink.AttributeEncoder){immediate(8, ip[:]), immediate(9, port(80)),
			expr("numgen", func(d *netlink.AttributeEncoder) { d.Uint32(1, 8) }), natExpr(nfprotoIPv4, 8, 9)}, nil},
		{"register never loaded", []func(ae *netlink.AttributeEncoder){immediate(8, ip[:]), natExpr(nfprotoIPv4, 8, 10)}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := mustParse(t, nftMsgNewRule, ruleMsg(t, unix.AF_INET, "kube-proxy", "endpoint-x", 42, tc.exprs...))
			var got []string
			for _, d := range ev.dests {
				got = append(got, d.String())
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("dests %v, want %v", got, tc.want)
			}
			if ev.table != "kube-proxy" || ev.chain != "endpoint-x" || ev.handle != 42 {
				t.Fatalf("identity %q %q %d", ev.table, ev.chain, ev.handle)
			}
		})
	}
}

func setMsg(t *testing.T, table, set string, dataType, dataLen uint32) []byte {
	return append(nfgen(unix.AF_INET), attrs(t, func(ae *netlink.AttributeEncoder) {
		ae.String(nftaSetTable, table)
		ae.String(nftaSetName, set)
		ae.Uint32(nftaSetDataType, dataType)
		ae.Uint32(nftaSetDataLen, dataLen)
	})...)
}

func elemMsg(t *testing.T, table, set string, elems map[uint32][]byte) []byte {
	return append(nfgen(unix.AF_INET), attrs(t, func(ae *netlink.AttributeEncoder) {
		ae.String(nftaSetElemListTable, table)
		ae.String(nftaSetElemListSet, set)
		ae.Nested(nftaSetElemListElements, func(l *netlink.AttributeEncoder) error {
			for k, data := range elems {
				l.Nested(nftaListElem, func(e *netlink.AttributeEncoder) error {
					e.Nested(nftaSetElemKey, func(v *netlink.AttributeEncoder) error {
						v.Bytes(nftaDataValue, binary.BigEndian.AppendUint32(nil, k))
						return nil
					})
					if data != nil {
						e.Nested(nftaSetElemData, func(v *netlink.AttributeEncoder) error { v.Bytes(nftaDataValue, data); return nil })
					}
					return nil
				})
			}
			return nil
		})
	})...)
}

func viewDests(v *nftView) []string {
	var out []string
	for d, n := range v.have {
		for range n {
			out = append(out, d.String())
		}
	}
	slices.Sort(out)
	return out
}

// Map elements typed address . port are destinations; deleting an
// element, the map, a rule, its chain or the table takes them away.
func TestNFTViewMapsAndDeletes(t *testing.T) {
	v := newNFTView(map[Dest]int{})
	ipv4Port := uint32(nftTypeIPv4Addr<<nftTypeBits | nftTypeInetService)
	data := func(a string, p uint16) []byte {
		ip := netip.MustParseAddr(a).As4()
		return append(append(ip[:], port(p)...), 0, 0) // port padded to a register
	}
	ip := netip.MustParseAddr("10.128.0.1").As4()
	for _, m := range []struct {
		kind int
		data []byte
	}{
		{nftMsgNewSet, setMsg(t, "kube-proxy", "__map0", ipv4Port, 8)},
		{nftMsgNewSetElem, elemMsg(t, "kube-proxy", "__map0", map[uint32][]byte{0: data("10.128.2.1", 8080), 1: data("10.128.2.2", 8080)})},
		{nftMsgNewSet, setMsg(t, "kube-proxy", "service-ips", 0xffffff00, 0)}, // a verdict map
		{nftMsgNewSetElem, elemMsg(t, "kube-proxy", "service-ips", map[uint32][]byte{7: nil})},
		{nftMsgNewRule, ruleMsg(t, unix.AF_INET, "kube-proxy", "endpoint-a", 5, immediate(8, ip[:]), immediate(9, port(8080)), natExpr(nfprotoIPv4, 8, 9))},
	} {
		v.apply(mustParse(t, m.kind, m.data))
	}
	want := []string{"10.128.0.1:8080", "10.128.2.1:8080", "10.128.2.2:8080"}
	if got := viewDests(v); !slices.Equal(got, want) {
		t.Fatalf("view %v, want %v", got, want)
	}
	v.apply(mustParse(t, nftMsgDelSetElem, elemMsg(t, "kube-proxy", "__map0", map[uint32][]byte{1: nil})))
	if got := viewDests(v); !slices.Equal(got, want[:2]) {
		t.Fatalf("after deleting an element: %v", got)
	}
	chain := append(nfgen(unix.AF_INET), attrs(t, func(ae *netlink.AttributeEncoder) {
		ae.String(nftaChainTable, "kube-proxy")
		ae.String(nftaChainName, "endpoint-a")
	})...)
	v.apply(mustParse(t, nftMsgDelChain, chain))
	if got := viewDests(v); !slices.Equal(got, want[1:2]) {
		t.Fatalf("after deleting the chain: %v", got)
	}
	table := append(nfgen(unix.AF_INET), attrs(t, func(ae *netlink.AttributeEncoder) { ae.String(nftaTableName, "kube-proxy") })...)
	v.apply(mustParse(t, nftMsgDelTable, table))
	if got := viewDests(v); len(got) != 0 || len(v.sets) != 0 || len(v.rules) != 0 {
		t.Fatalf("after deleting the table: %v (%d sets, %d rules)", got, len(v.sets), len(v.rules))
	}
}

func TestElemDest(t *testing.T) {
	v6 := netip.MustParseAddr("fd00::1").As16()
	for _, tc := range []struct {
		b    []byte
		want string
	}{
		{[]byte{10, 0, 0, 1, 0x1f, 0x90, 0, 0}, "10.0.0.1:8080"},
		{append(v6[:], 0, 80), "[fd00::1]:80"},
		{append(v6[:], 0, 80, 0, 0), "[fd00::1]:80"},
		{[]byte{10, 0, 0, 1}, ""},
	} {
		d, ok := elemDest(tc.b)
		if got := map[bool]string{true: d.String(), false: ""}[ok]; got != tc.want {
			t.Errorf("elemDest(%v) = %q, want %q", tc.b, got, tc.want)
		}
	}
	if !isDestType(nftTypeIPv4Addr<<nftTypeBits|nftTypeInetService, 8) || isDestType(nftTypeIPv4Addr, 4) {
		t.Error("isDestType")
	}
}

// The nf_tables reader sees what kube-proxy's nftables mode writes, as
// the nft program writes it: an anonymous "dnat ip to numgen … map" (what
// v1.36.3 writes per service), a DNAT in a chain reached through a verdict
// map (what earlier versions wrote), a named map of destinations; and
// follows their removal through events.
func TestKernelReaderNativeNFT(t *testing.T) {
	gate.Root(t)
	gate.Binaries(t, "nft", "ip")
	ns, err := NewNetns("native-nft")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	k, err := ns.OpenKernel("nft")
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	w, ctx := startWatcher(t, k)
	nft := func(script string) {
		t.Helper()
		cmd := ns.Command("nft", "-f", "-")
		cmd.Stdin = strings.NewReader(script)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("nft: %v: %s", err, out)
		}
	}
	nft(`table ip kp {
	map dests {
		type inet_service : ipv4_addr . inet_service
		elements = { 80 : 10.128.3.1 . 8080, 81 : 10.128.3.2 . 8080 }
	}
	chain ep-a {
		meta l4proto tcp dnat to 10.128.0.1:8080
	}
	chain ep-b {
		meta l4proto tcp dnat to 10.128.0.2:8080
	}
	chain svc {
		numgen random mod 2 vmap { 0 : goto ep-a, 1 : goto ep-b }
	}
	chain svc2 {
		meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.128.2.1 . 8080, 1 : 10.128.2.2 . 8080 }
	}
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr 10.96.0.1 tcp dport 80 jump svc
		ip daddr 10.96.0.2 tcp dport 80 jump svc2
		ip daddr 10.96.0.3 dnat ip to tcp dport map @dests
	}
}
`)
	want := []string{"10.128.0.1:8080", "10.128.0.2:8080", "10.128.2.1:8080", "10.128.2.2:8080", "10.128.3.1:8080", "10.128.3.2:8080"}
	if got := scanAll(t, k); !slices.Equal(got, want) {
		t.Fatalf("dump: %v, want %v", got, want)
	}
	last := DestOf(netip.MustParseAddrPort("10.128.3.2:8080"))
	if _, err := w.WaitFlip(ctx, last, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, s := range want {
		if !w.Has(DestOf(netip.MustParseAddrPort(s))) {
			t.Errorf("events: %s not seen", s)
		}
	}
	gone := func(what string, ds ...string) {
		t.Helper()
		for _, s := range ds {
			for d := DestOf(netip.MustParseAddrPort(s)); w.Has(d); {
				if _, err := w.Poll(ctx); err != nil {
					t.Fatalf("%s: %s stays in the watcher's view: %v", what, s, err)
				}
			}
		}
	}
	nft("delete element ip kp dests { 81 }\n")
	gone("a deleted map element", "10.128.3.2:8080")
	nft("flush chain ip kp ep-a\n")
	gone("a flushed chain", "10.128.0.1:8080")
	nft("flush chain ip kp svc2\n")
	gone("a deleted rule's anonymous map", "10.128.2.1:8080", "10.128.2.2:8080")
	if !w.Has(DestOf(netip.MustParseAddrPort("10.128.0.2:8080"))) {
		t.Fatal("a rule that stayed left the watcher's view")
	}
	nft("delete table ip kp\n")
	gone("a deleted table", "10.128.0.2:8080", "10.128.3.1:8080")
	if got := scanAll(t, k); len(got) != 0 {
		t.Fatalf("after deleting the table: %v", got)
	}
}
