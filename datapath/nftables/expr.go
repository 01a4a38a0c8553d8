package nftables

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/edgeproxy/edgeproxy/datapath"
)

// A rule is its nft text, as `nft list` prints it, and the expressions
// that make it. The text is the rule's identity: two rules are the same
// when their texts are, which is what partial syncs compare, and the
// kernel tests hold every text to what Debian's nft prints for the
// expressions (TestRuleTextIsNftText). Rules are built only by the
// functions below, one per shape, so that text and expressions cannot
// drift apart.
type rule struct {
	text  string
	exprs []expr.Any
	// anon is the anonymous map the rule looks up, if any: written
	// in the rule's batch (addRules), and gone with the rule.
	anon *anonMap
}

// anonMap is a rule's anonymous map: its elements, and where the rule's
// lookup of it goes in its expressions (the set's transaction ID and
// name are known only once the set is queued).
type anonMap struct {
	interval bool
	data     nftables.SetDatatype
	elems    []nftables.SetElement
	at       int
}

// Registers as nft allocates them: a 128-bit register for the first
// field, the 32-bit registers after it for the following fields of a
// concatenation (NFT_REG32_00 is 8 and overlays NFT_REG_1).
const (
	reg1   = unix.NFT_REG_1
	reg2   = unix.NFT_REG_2
	reg32  = unix.NFT_REG32_00
	regVer = unix.NFT_REG_VERDICT
)

// concatRegs returns the registers of the fields of a concatenation whose
// fields take sizes bytes each (each rounded up to 4): the first field in
// NFT_REG_1, the next ones in the 32-bit registers that follow it.
func concatRegs(sizes ...uint32) []uint32 {
	regs := make([]uint32, len(sizes))
	word := uint32(0)
	for i, s := range sizes {
		if i == 0 {
			regs[i] = reg1
		} else {
			regs[i] = reg32 + word
		}
		word += (s + 3) / 4
	}
	return regs
}

func hostU32(v uint32) []byte { return binaryutil.NativeEndian.PutUint32(v) }
func beU32(v uint32) []byte   { return binaryutil.BigEndian.PutUint32(v) }

func loadAddr(f *fam, dst bool, reg uint32) *expr.Payload {
	off := f.saddrOff
	if dst {
		off = f.daddrOff
	}
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: f.addrLen}
}

func addrWord(f *fam, dst bool) string {
	if dst {
		return f.name + " daddr"
	}
	return f.name + " saddr"
}

// matchPrefix matches the source or destination address against p, or
// anything outside it when not is set: "ip saddr != 10.244.0.0/16".
func matchPrefix(f *fam, dst, not bool, p netip.Prefix) ([]expr.Any, string) {
	op, word := expr.CmpOpEq, ""
	if not {
		op, word = expr.CmpOpNeq, "!= "
	}
	p = p.Masked()
	text := addrWord(f, dst) + " " + word + p.String()
	if p.Bits() == p.Addr().BitLen() {
		text = addrWord(f, dst) + " " + word + p.Addr().String()
		return []expr.Any{loadAddr(f, dst, reg1), &expr.Cmp{Op: op, Register: reg1, Data: p.Addr().AsSlice()}}, text
	}
	mask := netipMask(p)
	return []expr.Any{
		loadAddr(f, dst, reg1),
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: f.addrLen, Mask: mask, Xor: make([]byte, f.addrLen)},
		&expr.Cmp{Op: op, Register: reg1, Data: p.Addr().AsSlice()},
	}, text
}

// matchPods matches traffic from pods as m tells them, or any other
// traffic when not is set: "ip saddr != 10.244.0.0/16",
// `iifname != "cni0"`, `iifname "veth*"` (a prefix: only its bytes are
// compared, as nft writes it; a name is compared whole, padded with
// zeros to IFNAMSIZ).
func matchPods(f *fam, not bool, m podMatch) ([]expr.Any, string) {
	if m.iface == "" {
		return matchPrefix(f, false, not, m.cidr)
	}
	op, word := expr.CmpOpEq, ""
	if not {
		op, word = expr.CmpOpNeq, "!= "
	}
	data := []byte(m.iface)
	if prefix, ok := strings.CutSuffix(m.iface, "*"); ok {
		data = []byte(prefix)
	} else {
		data = append(data, make([]byte, unix.IFNAMSIZ-len(data))...)
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
		&expr.Cmp{Op: op, Register: reg1, Data: data},
	}, fmt.Sprintf("iifname %s%q", word, m.iface)
}

func netipMask(p netip.Prefix) []byte {
	n := p.Addr().BitLen() / 8
	m := make([]byte, n)
	for i := 0; i < p.Bits(); i++ {
		m[i/8] |= 0x80 >> (i % 8)
	}
	return m
}

// dispatch: "ip daddr . meta l4proto . th dport vmap @set" (byAddr) or
// "meta l4proto . th dport vmap @set".
func dispatchExprs(f *fam, byAddr bool, set string) []expr.Any {
	var out []expr.Any
	var regs []uint32
	if byAddr {
		regs = concatRegs(f.addrLen, 1, 2)
		out = append(out, loadAddr(f, true, regs[0]))
		regs = regs[1:]
	} else {
		regs = concatRegs(1, 2)
	}
	return append(out,
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: regs[0]},
		&expr.Payload{DestRegister: regs[1], Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: reg1, DestRegister: regVer, IsDestRegSet: true, SetName: set},
	)
}

func dispatchText(f *fam, byAddr bool, set string) string {
	if byAddr {
		return addrWord(f, true) + " . meta l4proto . th dport vmap @" + set
	}
	return "meta l4proto . th dport vmap @" + set
}

// fibLocal: "fib daddr type local".
func fibLocal() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: reg1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: hostU32(unix.RTN_LOCAL)},
	}
}

// ctNew: "ct state new".
func ctNew() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: reg1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: hostU32(expr.CtStateBitNEW), Xor: hostU32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: hostU32(0)},
	}
}

// ctDNAT: "ct status dnat".
func ctDNAT() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: reg1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: hostU32(ipsDstNAT), Xor: hostU32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: hostU32(0)},
	}
}

// setMark: "meta mark set meta mark | 0x00004000".
func setMark(bit uint32) ([]expr.Any, string) {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: hostU32(^bit), Xor: hostU32(bit)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1},
	}, fmt.Sprintf("meta mark set meta mark | 0x%08x", bit)
}

func verdict(k expr.VerdictKind, chain string) *expr.Verdict {
	return &expr.Verdict{Kind: k, Chain: chain}
}

func verdictText(k expr.VerdictKind, chain string) string {
	switch k {
	case expr.VerdictJump:
		return "jump " + chain
	case expr.VerdictGoto:
		return "goto " + chain
	case expr.VerdictDrop:
		return "drop"
	case expr.VerdictReturn:
		return "return"
	case expr.VerdictAccept:
		return "accept"
	}
	return fmt.Sprintf("verdict(%d)", k)
}

// The rules, one function per shape.

// ruleJump: "[ct state new ]jump chain".
func ruleJump(onlyNew bool, chain string) rule {
	var r rule
	if onlyNew {
		r.exprs, r.text = ctNew(), "ct state new "
	}
	r.exprs = append(r.exprs, verdict(expr.VerdictJump, chain))
	r.text += verdictText(expr.VerdictJump, chain)
	return r
}

// ruleDispatch: "ip daddr . meta l4proto . th dport vmap @set".
func ruleDispatch(f *fam, byAddr bool, set string) rule {
	return rule{text: dispatchText(f, byAddr, set), exprs: dispatchExprs(f, byAddr, set)}
}

// ruleNodePortDispatch: "fib daddr type local ip daddr != 127.0.0.0/8
// meta l4proto . th dport vmap @set": node ports answer on the node's
// own addresses, never on loopback (kube-proxy's nftables mode has no
// localhost node ports either). Restricted (nodePortAddresses): "ip
// daddr @nodeport-ips meta l4proto . th dport vmap @set".
func ruleNodePortDispatch(f *fam, restricted bool, set string) rule {
	var ex []expr.Any
	var text string
	if restricted {
		ex = []expr.Any{loadAddr(f, true, reg1), &expr.Lookup{SourceRegister: reg1, SetName: setNodePortIPs}}
		text = addrWord(f, true) + " @" + setNodePortIPs + " "
	} else {
		ex = fibLocal()
		m, t := matchPrefix(f, true, true, f.loopback)
		ex = append(ex, m...)
		text = "fib daddr type local " + t + " "
	}
	ex = append(ex, dispatchExprs(f, false, set)...)
	return rule{text: text + dispatchText(f, false, set), exprs: ex}
}

// ruleReject: "reject".
func ruleReject(f *fam) rule {
	return rule{text: "reject", exprs: []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: f.portUnreach}}}
}

// ruleAddrReject: "ip daddr @set reject".
func ruleAddrReject(f *fam, set string) rule {
	r := ruleReject(f)
	r.exprs = append([]expr.Any{loadAddr(f, true, reg1), &expr.Lookup{SourceRegister: reg1, SetName: set}}, r.exprs...)
	r.text = addrWord(f, true) + " @" + set + " " + r.text
	return r
}

// ruleHairpinMark: "ct status dnat ip saddr . ip daddr @set meta mark set
// meta mark | 0x00004000": an endpoint that reached itself through a
// service must be masqueraded, or it would answer itself directly.
func ruleHairpinMark(f *fam, set string, bit uint32) rule {
	ex := ctDNAT()
	regs := concatRegs(f.addrLen, f.addrLen)
	ex = append(ex, loadAddr(f, false, regs[0]), loadAddr(f, true, regs[1]),
		&expr.Lookup{SourceRegister: reg1, SetName: set})
	m, mt := setMark(bit)
	ex = append(ex, m...)
	return rule{text: "ct status dnat " + addrWord(f, false) + " . " + addrWord(f, true) + " @" + set + " " + mt, exprs: ex}
}

// ruleUnmarkedReturn: "meta mark & 0x00004000 == 0x00000000 return".
func ruleUnmarkedReturn(bit uint32) rule {
	return rule{text: fmt.Sprintf("meta mark & 0x%08x == 0x00000000 return", bit), exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: hostU32(bit), Xor: hostU32(0)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: hostU32(0)},
		verdict(expr.VerdictReturn, ""),
	}}
}

// ruleClearMark: "meta mark set meta mark ^ 0x00004000", so that a packet
// that passes the hook again is not masqueraded twice.
func ruleClearMark(bit uint32) rule {
	return rule{text: fmt.Sprintf("meta mark set meta mark ^ 0x%08x", bit), exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: hostU32(0xffffffff), Xor: hostU32(bit)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1},
	}}
}

// ruleMasquerade: "masquerade fully-random".
func ruleMasquerade() rule {
	return rule{text: "masquerade fully-random", exprs: []expr.Any{&expr.Masq{FullyRandom: true}}}
}

// ruleMarkFrom: "ip daddr VIP [ip saddr != CIDR ]meta mark set meta mark |
// 0x00004000": traffic to a cluster IP from outside the pod ranges (or
// any, with no range) is masqueraded.
func ruleMarkFrom(f *fam, vip netip.Addr, notFrom podMatch, bit uint32) rule {
	ex, text := matchPrefix(f, true, false, netip.PrefixFrom(vip, vip.BitLen()))
	if notFrom.valid() {
		m, t := matchPods(f, true, notFrom)
		ex = append(ex, m...)
		text += " " + t
	}
	m, t := setMark(bit)
	return rule{text: text + " " + t, exprs: append(ex, m...)}
}

// ruleMark: "meta mark set meta mark | 0x00004000".
func ruleMark(bit uint32) rule {
	ex, t := setMark(bit)
	return rule{text: t, exprs: ex}
}

// ruleGoto: "goto chain".
func ruleGoto(chain string) rule {
	return rule{text: "goto " + chain, exprs: []expr.Any{verdict(expr.VerdictGoto, chain)}}
}

// ruleDNAT: "[numgen random mod R < w ]meta l4proto P dnat to ADDR:PORT".
// The protocol match is what lets nft read the port back (a port mapping
// is only valid after a transport protocol match). With w == 1
// the test is "== 0", which nft prints as "numgen random mod R 0"; a
// larger w needs the number in network order for the comparison
// (byteorder), as nft itself writes it. mod 0 means no test: the last
// endpoint takes what is left.
func ruleDNAT(f *fam, proto datapath.Protocol, to netip.AddrPort, mod, w uint32) rule {
	return ruleDNATUpdate(f, proto, to, mod, w, nil, "")
}

// ruleDNATUpdate is ruleDNAT with the update statement upd (text t), if
// any, between the numgen test and the dnat.
func ruleDNATUpdate(f *fam, proto datapath.Protocol, to netip.AddrPort, mod, w uint32, upd []expr.Any, t string) rule {
	var ex []expr.Any
	text := ""
	switch {
	case mod == 0:
	case w == 1:
		ex = append(ex,
			&expr.Numgen{Register: reg1, Modulus: mod, Type: unix.NFT_NG_RANDOM},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: hostU32(0)})
		text = fmt.Sprintf("numgen random mod %d 0 ", mod)
	default:
		ex = append(ex,
			&expr.Numgen{Register: reg1, Modulus: mod, Type: unix.NFT_NG_RANDOM},
			&expr.Byteorder{SourceRegister: reg1, DestRegister: reg1, Op: expr.ByteorderHton, Len: 4, Size: 4},
			&expr.Cmp{Op: expr.CmpOpLt, Register: reg1, Data: beU32(w)})
		text = fmt.Sprintf("numgen random mod %d < %d ", mod, w)
	}
	if upd != nil {
		ex = append(ex, upd...)
		text += t + " "
	}
	port := binary.BigEndian.AppendUint16(nil, to.Port())
	ex = append(ex,
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{proto.Number()}},
		&expr.Immediate{Register: reg1, Data: to.Addr().AsSlice()},
		&expr.Immediate{Register: reg2, Data: port},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: f.nfproto, RegAddrMin: reg1, RegProtoMin: reg2, Specified: true})
	dst := to.String()
	return rule{text: text + "meta l4proto " + strings.ToLower(string(proto)) + " dnat to " + dst, exprs: ex}
}

// ruleDNATMap: "meta l4proto P dnat ip to numgen random mod R map { 0 :
// A . P, … }", one rule for every endpoint of a Service chain: numgen
// picks a slot, an anonymous map of the rule's own turns it into the
// endpoint's address and port. With weights (divided by their greatest
// common divisor, slots: their sum) each endpoint holds a range of slots
// as wide as its weight ("0-1 : A . P, 2-7 : B . P"), an interval map;
// equal weights give one slot each, a plain map. Either way the shares
// are exact. nft prints the key in network order, as google/nftables
// marks every anonymous set's key (byteorder).
//
// Against a cascade of one rule per endpoint, the kernel parses six
// expressions and a set instead of 7n expressions: a cold start at 5k
// Services costs a third (RATIONALE.md).
func ruleDNATMap(f *fam, proto datapath.Protocol, eps []datapath.Endpoint, weights []uint32) rule {
	m := &anonMap{data: nftables.MustConcatSetType(f.addrType, nftables.TypeInetService)}
	var slots uint32
	var b strings.Builder
	for i, e := range eps {
		w := weights[i]
		val := slices.Concat(e.Addr.Addr().AsSlice(), binary.BigEndian.AppendUint16(nil, e.Addr.Port()), []byte{0, 0})
		m.elems = append(m.elems, nftables.SetElement{Key: beU32(slots), Val: val})
		m.interval = m.interval || w > 1
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d", slots)
		if w > 1 {
			fmt.Fprintf(&b, "-%d", slots+w-1)
		}
		fmt.Fprintf(&b, " : %s . %d", e.Addr.Addr(), e.Addr.Port())
		slots += w
	}
	if m.interval {
		m.elems = append(m.elems, nftables.SetElement{Key: beU32(slots), IntervalEnd: true})
	}
	regs := concatRegs(f.addrLen, 2)
	ex := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{proto.Number()}},
		&expr.Numgen{Register: reg1, Modulus: slots, Type: unix.NFT_NG_RANDOM},
		&expr.Byteorder{SourceRegister: reg1, DestRegister: reg1, Op: expr.ByteorderHton, Len: 4, Size: 4},
	}
	m.at = len(ex)
	ex = append(ex,
		nil, // the lookup of m (addRuleOver)
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: f.nfproto, RegAddrMin: regs[0], RegProtoMin: regs[1], Specified: true})
	text := fmt.Sprintf("meta l4proto %s dnat %s to numgen random mod %d map { %s }", strings.ToLower(string(proto)), f.name, slots, b.String())
	return rule{text: text, exprs: ex, anon: m}
}

// lookup is the expression that looks set up for anon's rule.
func (m *anonMap) lookup(set *nftables.Set) *expr.Lookup {
	return &expr.Lookup{SourceRegister: reg1, DestRegister: reg1, IsDestRegSet: true, SetID: set.ID, SetName: set.Name}
}

// ipsDstNAT is IPS_DST_NAT of linux/netfilter/nf_conntrack_common.h: the
// connection's destination was translated.
const ipsDstNAT = 1 << 5

// ruleFromGoto: "ip saddr CIDR goto chain" (traffic from pods).
func ruleFromGoto(f *fam, from podMatch, chain string) rule {
	ex, t := matchPods(f, false, from)
	return rule{text: t + " goto " + chain, exprs: append(ex, verdict(expr.VerdictGoto, chain))}
}

// fibLocalSource: "fib saddr type local" (traffic from the node itself).
func fibLocalSource() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: reg1, FlagSADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: hostU32(unix.RTN_LOCAL)},
	}
}

// ruleLocalSourceMark: "fib saddr type local meta mark set meta mark |
// 0x00004000".
func ruleLocalSourceMark(bit uint32) rule {
	m, t := setMark(bit)
	return rule{text: "fib saddr type local " + t, exprs: append(fibLocalSource(), m...)}
}

// ruleLocalSourceGoto: "fib saddr type local goto chain".
func ruleLocalSourceGoto(chain string) rule {
	return rule{text: "fib saddr type local goto " + chain, exprs: append(fibLocalSource(), verdict(expr.VerdictGoto, chain))}
}

// ruleFirewall: "ct state new ip daddr . meta l4proto . th dport
// @firewall-ips ip daddr . meta l4proto . th dport . ip saddr !=
// @firewall-allow drop": a load balancer with source ranges is reached
// only from them. It runs before DNAT (prerouting and output at dstnat -
// 10), while the destination is still the load balancer's address.
func ruleFirewall(f *fam, ips, allow string) rule {
	ex := ctNew()
	regs := concatRegs(f.addrLen, 1, 2)
	ex = append(ex,
		loadAddr(f, true, regs[0]),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: regs[1]},
		&expr.Payload{DestRegister: regs[2], Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: reg1, SetName: ips})
	regs = concatRegs(f.addrLen, 1, 2, f.addrLen)
	ex = append(ex,
		loadAddr(f, true, regs[0]),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: regs[1]},
		&expr.Payload{DestRegister: regs[2], Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		loadAddr(f, false, regs[3]),
		&expr.Lookup{SourceRegister: reg1, SetName: allow, Invert: true},
		verdict(expr.VerdictDrop, ""))
	key := addrWord(f, true) + " . meta l4proto . th dport"
	return rule{text: "ct state new " + key + " @" + ips + " " + key + " . " + addrWord(f, false) + " != @" + allow + " drop", exprs: ex}
}

// ruleAffinityCheck: "ip6 saddr @SET update @SET { ip6 saddr timeout T }
// meta l4proto P dnat to ADDR:PORT": a client remembered in the
// endpoint's affinity set goes back to it, and its timeout
// starts again (kube-proxy counts it from the last connection).
func ruleAffinityCheck(f *fam, proto datapath.Protocol, to netip.AddrPort, set string, affinity time.Duration) rule {
	r := ruleDNATAffinitySet(f, proto, to, 0, 0, affinity, set)
	r.exprs = append([]expr.Any{loadAddr(f, false, reg1), &expr.Lookup{SourceRegister: reg1, SetName: set}}, r.exprs...)
	r.text = addrWord(f, false) + " @" + set + " " + r.text
	return r
}

// ruleDNATAffinitySet is ruleDNAT that, with a timeout, also remembers the
// client in the endpoint's affinity set: "[numgen …] update
// @SET { ip6 saddr timeout T } meta l4proto P dnat to ADDR:PORT". The key
// is the address alone, no concatenation, which Debian 12's nft reads
// back for IPv6 too.
func ruleDNATAffinitySet(f *fam, proto datapath.Protocol, to netip.AddrPort, mod, w uint32, affinity time.Duration, set string) rule {
	if affinity <= 0 {
		return ruleDNAT(f, proto, to, mod, w)
	}
	upd := []expr.Any{
		loadAddr(f, false, reg1),
		&expr.Dynset{SrcRegKey: reg1, SetName: set, Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: affinity},
	}
	t := "update @" + set + " { " + addrWord(f, false) + " timeout " + nftTime(affinity) + " }"
	return ruleDNATUpdate(f, proto, to, mod, w, upd, t)
}

// nftTime writes d as nft prints a timeout: days, hours, minutes,
// seconds and milliseconds, the zero ones left out ("3h", "1m30s").
func nftTime(d time.Duration) string {
	ms := d.Milliseconds()
	var b strings.Builder
	for _, u := range []struct {
		n    int64
		unit string
	}{{86400000, "d"}, {3600000, "h"}, {60000, "m"}, {1000, "s"}, {1, "ms"}} {
		if v := ms / u.n; v > 0 {
			fmt.Fprintf(&b, "%d%s", v, u.unit)
			ms -= v * u.n
		}
	}
	if b.Len() == 0 {
		return "0s"
	}
	return b.String()
}

// ruleInvalidDrop: "ct state invalid drop".
func ruleInvalidDrop() rule {
	return rule{text: "ct state invalid drop", exprs: []expr.Any{
		&expr.Ct{Register: reg1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: hostU32(expr.CtStateBitINVALID), Xor: hostU32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: hostU32(0)},
		verdict(expr.VerdictDrop, ""),
	}}
}
