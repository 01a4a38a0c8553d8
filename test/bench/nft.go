package bench

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// What nf_tables says about DNAT destinations, decoded from its netlink
// messages (events and dumps alike). A destination is written three ways:
//
//   - an xtables-compat DNAT target (iptables-nft), its data the x_tables
//     struct (dnatDest);
//   - a native nat expression whose address and port registers an
//     immediate expression loaded earlier in the same rule ("dnat to
//     10.128.0.1:8080", kube-proxy's per-endpoint chains);
//   - a nat expression fed by a map lookup ("dnat to numgen random mod 3
//     map { 0 : 10.128.0.1 . 8080, … }"): the destinations are the data of
//     the map's elements, typed ipv4_addr . inet_service (or ipv6_addr).
//
// Rules and set elements are kept by identity (table, chain, handle; set
// and element key), so that a deleted rule, chain, set or table takes its
// destinations with it, as the kernel does.

// nf_tables message types (NFT_MSG_*) and attributes (NFTA_*), from
// linux/netfilter/nf_tables.h.
const (
	nftMsgNewTable   = 0
	nftMsgDelTable   = 2
	nftMsgDelChain   = 5
	nftMsgNewRule    = 6
	nftMsgGetRule    = 7
	nftMsgDelRule    = 8
	nftMsgNewSet     = 9
	nftMsgGetSet     = 10
	nftMsgDelSet     = 11
	nftMsgNewSetElem = 12
	nftMsgGetSetElem = 13
	nftMsgDelSetElem = 14
	nftMsgNewGen     = 15
	// nftMsgOther is any other message of a transaction (a table, a
	// chain): only its size is kept.
	nftMsgOther = -1

	nftaTableName  = 1
	nftaChainTable = 1
	nftaChainName  = 3
	nftaRuleTable  = 1
	nftaRuleChain  = 2
	nftaRuleHandle = 3
	nftaRuleExprs  = 4
	nftaListElem   = 1
	nftaExprName   = 1
	nftaExprData   = 2
	nftaTargetName = 1
	nftaTargetRev  = 2
	nftaTargetInfo = 3

	nftaImmediateDreg = 1
	nftaImmediateData = 2
	nftaDataValue     = 1

	nftaNatType        = 1
	nftaNatFamily      = 2
	nftaNatRegAddrMin  = 3
	nftaNatRegProtoMin = 5
	nftNatDNAT         = 1

	nftaSetTable    = 1
	nftaSetName     = 2
	nftaSetDataType = 6
	nftaSetDataLen  = 7

	nftaSetElemListTable    = 1
	nftaSetElemListSet      = 2
	nftaSetElemListElements = 3
	nftaSetElemKey          = 1
	nftaSetElemData         = 2

	nfprotoInet = 1
	nfprotoIPv4 = 2
	nfprotoIPv6 = 10
)

// nft's own data type numbers (nftables datatype.h), which it stores in
// NFTA_SET_DATA_TYPE; a concatenation is its parts, 6 bits each.
const (
	nftTypeIPv4Addr    = 7
	nftTypeIPv6Addr    = 8
	nftTypeInetService = 13
	nftTypeBits        = 6
)

// nftEvent is one nf_tables message: what it adds or removes, or (NEWGEN)
// the end of a committed transaction.
type nftEvent struct {
	kind   int // nftMsg*
	family uint8
	table  string
	chain  string // rules, chains
	set    string // sets, elements
	handle uint64 // rules
	dests  []netip.AddrPort
	elems  []nftElem // NEWSETELEM, DELSETELEM
	dnat   bool      // NEWSET: its data are DNAT destinations
	gen    uint64    // NEWGEN
	// size is the message's length on the wire, header included (events
	// from the socket only).
	size int
}

// nftElem is a set element: its key bytes and the destination its data holds.
type nftElem struct {
	key  string
	dest netip.AddrPort // invalid when the data is not a destination
}

// parseNFT decodes one nf_tables message (type without the subsystem,
// data from the nfgenmsg on). ok is false for messages that say nothing
// about destinations.
func parseNFT(kind int, data []byte) (ev nftEvent, ok bool, err error) {
	if len(data) < 4 {
		return ev, false, nil
	}
	ev = nftEvent{kind: kind, family: data[0]}
	ad, err := netlink.NewAttributeDecoder(data[4:])
	if err != nil {
		return ev, false, fmt.Errorf("bench: nf_tables message %d: %w", kind, err)
	}
	ad.ByteOrder = binary.BigEndian
	switch kind {
	case nftMsgNewRule, nftMsgDelRule:
		err = ev.rule(ad)
	case nftMsgNewSet, nftMsgDelSet:
		err = ev.setAttrs(ad)
	case nftMsgNewSetElem, nftMsgDelSetElem:
		err = ev.setElems(ad)
	case nftMsgDelChain:
		for ad.Next() {
			switch ad.Type() {
			case nftaChainTable:
				ev.table = ad.String()
			case nftaChainName:
				ev.chain = ad.String()
			}
		}
	case nftMsgNewTable, nftMsgDelTable:
		for ad.Next() {
			if ad.Type() == nftaTableName {
				ev.table = ad.String()
			}
		}
	case nftMsgNewGen:
		for ad.Next() {
			if ad.Type() == 1 { // NFTA_GEN_ID
				ev.gen = uint64(ad.Uint32())
			}
		}
	default:
		return ev, false, nil
	}
	if err == nil {
		err = ad.Err()
	}
	if err != nil {
		return ev, false, fmt.Errorf("bench: nf_tables message %d: %w", kind, err)
	}
	return ev, true, nil
}

func (ev *nftEvent) rule(ad *netlink.AttributeDecoder) error {
	for ad.Next() {
		switch ad.Type() {
		case nftaRuleTable:
			ev.table = ad.String()
		case nftaRuleChain:
			ev.chain = ad.String()
		case nftaRuleHandle:
			ev.handle = ad.Uint64()
		case nftaRuleExprs:
			ad.Nested(func(list *netlink.AttributeDecoder) error {
				ev.dests = ruleDests(list)
				return nil
			})
		}
	}
	return nil
}

// ruleDests runs a rule's expressions over a model of the register file,
// enough to see what a nat expression reads: the values immediates load.
func ruleDests(list *netlink.AttributeDecoder) []netip.AddrPort {
	var regs registers
	var out []netip.AddrPort
	for list.Next() {
		if list.Type() != nftaListElem {
			continue
		}
		var name string
		var data []byte
		list.Nested(func(expr *netlink.AttributeDecoder) error {
			for expr.Next() {
				switch expr.Type() {
				case nftaExprName:
					name = expr.String()
				case nftaExprData:
					data = expr.Bytes()
				}
			}
			return nil
		})
		switch name {
		case "immediate":
			regs.immediate(data)
		case "nat":
			if d, ok := regs.dnat(data); ok {
				out = append(out, d)
			}
		case "target":
			target(data, func(d Dest) { out = append(out, d.AddrPort()) })
		case "counter":
		default:
			// Any other expression may load registers: what an immediate
			// put there before is no longer known.
			regs = registers{}
		}
	}
	return out
}

// registers models nf_tables' register file in 32-bit words: NFT_REG_1..4
// are 16 bytes each from word 4 (after the verdict), NFT_REG32_00..15
// (8..23) one word each from word 4 too.
type registers struct {
	word  [20][4]byte
	known [20]bool
}

func regWord(r uint32) (int, bool) {
	switch {
	case r >= 1 && r <= 4:
		return int(r) * 4, true
	case r >= 8 && r <= 23:
		return int(r) - 8 + 4, true
	}
	return 0, false
}

func (rs *registers) immediate(b []byte) {
	var dreg uint32
	var value []byte
	_ = eachAttr(b, func(ad *netlink.AttributeDecoder) {
		switch ad.Type() {
		case nftaImmediateDreg:
			dreg = ad.Uint32()
		case nftaImmediateData:
			value = dataValue(ad)
		}
	})
	w, ok := regWord(dreg)
	if !ok || value == nil {
		return // a verdict, or a register we do not model
	}
	for i := 0; i < len(value) && w < len(rs.word); i, w = i+4, w+1 {
		rs.word[w] = [4]byte{}
		copy(rs.word[w][:], value[i:])
		rs.known[w] = true
	}
}

func (rs *registers) read(r uint32, n int) ([]byte, bool) {
	w, ok := regWord(r)
	if !ok {
		return nil, false
	}
	var out []byte
	for ; len(out) < n; w++ {
		if w >= len(rs.word) || !rs.known[w] {
			return nil, false
		}
		out = append(out, rs.word[w][:]...)
	}
	return out[:n], true
}

// dnat decodes a nat expression: a DNAT whose address (and port) come from
// registers an immediate loaded.
func (rs *registers) dnat(b []byte) (netip.AddrPort, bool) {
	var typ, family, addrReg, protoReg uint32
	err := eachAttr(b, func(ad *netlink.AttributeDecoder) {
		switch ad.Type() {
		case nftaNatType:
			typ = ad.Uint32()
		case nftaNatFamily:
			family = ad.Uint32()
		case nftaNatRegAddrMin:
			addrReg = ad.Uint32()
		case nftaNatRegProtoMin:
			protoReg = ad.Uint32()
		}
	})
	if err != nil {
		return netip.AddrPort{}, false
	}
	if typ != nftNatDNAT || addrReg == 0 {
		return netip.AddrPort{}, false
	}
	size := 4
	if family == nfprotoIPv6 {
		size = 16
	}
	a, ok := rs.read(addrReg, size)
	if !ok {
		return netip.AddrPort{}, false
	}
	addr, _ := netip.AddrFromSlice(a)
	var port uint16
	if protoReg != 0 {
		p, ok := rs.read(protoReg, 2)
		if !ok {
			return netip.AddrPort{}, false
		}
		port = binary.BigEndian.Uint16(p)
	}
	return netip.AddrPortFrom(addr, port), true
}

func (ev *nftEvent) setAttrs(ad *netlink.AttributeDecoder) error {
	var dataType, dataLen uint32
	for ad.Next() {
		switch ad.Type() {
		case nftaSetTable:
			ev.table = ad.String()
		case nftaSetName:
			ev.set = ad.String()
		case nftaSetDataType:
			dataType = ad.Uint32()
		case nftaSetDataLen:
			dataLen = ad.Uint32()
		}
	}
	ev.dnat = isDestType(dataType, dataLen)
	return nil
}

// isDestType: a map whose data is an address and a port, what "dnat to …
// map" reads (data padded to 32-bit registers: 8 bytes for IPv4, 20 for
// IPv6; 18 accepted too).
func isDestType(typ, n uint32) bool {
	switch typ {
	case nftTypeIPv4Addr<<nftTypeBits | nftTypeInetService:
		return n == 8
	case nftTypeIPv6Addr<<nftTypeBits | nftTypeInetService:
		return n == 18 || n == 20
	}
	return false
}

// elemDest decodes a map element's data as address . port.
func elemDest(b []byte) (netip.AddrPort, bool) {
	var addr netip.Addr
	var p []byte
	switch len(b) {
	case 8:
		addr, p = netip.AddrFrom4([4]byte(b[:4])), b[4:6]
	case 18, 20:
		addr, p = netip.AddrFrom16([16]byte(b[:16])), b[16:18]
	default:
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(addr, binary.BigEndian.Uint16(p)), true
}

func (ev *nftEvent) setElems(ad *netlink.AttributeDecoder) error {
	for ad.Next() {
		switch ad.Type() {
		case nftaSetElemListTable:
			ev.table = ad.String()
		case nftaSetElemListSet:
			ev.set = ad.String()
		case nftaSetElemListElements:
			ad.Nested(func(list *netlink.AttributeDecoder) error {
				for list.Next() {
					if list.Type() == nftaListElem {
						list.Nested(func(e *netlink.AttributeDecoder) error {
							ev.elems = append(ev.elems, setElem(e))
							return nil
						})
					}
				}
				return nil
			})
		}
	}
	return nil
}

func setElem(e *netlink.AttributeDecoder) nftElem {
	var el nftElem
	for e.Next() {
		switch e.Type() {
		case nftaSetElemKey:
			el.key = string(dataValue(e))
		case nftaSetElemData:
			if d, ok := elemDest(dataValue(e)); ok {
				el.dest = d
			}
		}
	}
	return el
}

// dataValue is the NFTA_DATA_VALUE inside the nested attribute at ad (nil
// for a verdict).
func dataValue(ad *netlink.AttributeDecoder) []byte {
	var v []byte
	ad.Nested(func(d *netlink.AttributeDecoder) error {
		for d.Next() {
			if d.Type() == nftaDataValue {
				v = d.Bytes()
			}
		}
		return nil
	})
	return v
}

// eachAttr calls fn for every attribute of b, big-endian as nf_tables
// writes them.
func eachAttr(b []byte, fn func(ad *netlink.AttributeDecoder)) error {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return err
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		fn(ad)
	}
	return ad.Err()
}

// nftView is the destinations nf_tables holds, kept by the identity of
// what holds them, with a count per destination (have).
type nftView struct {
	have  map[Dest]int
	rules map[nftRuleKey][]Dest
	sets  map[nftSetKey]*nftSet
}

type nftRuleKey struct {
	family       uint8
	table, chain string
	handle       uint64
}

type nftSetKey struct {
	family     uint8
	table, set string
}

type nftSet struct {
	dnat  bool
	elems map[string]Dest
}

func newNFTView(have map[Dest]int) *nftView {
	return &nftView{have: have, rules: map[nftRuleKey][]Dest{}, sets: map[nftSetKey]*nftSet{}}
}

func (v *nftView) reset() {
	clear(v.have)
	clear(v.rules)
	clear(v.sets)
}

func (v *nftView) add(d Dest) { v.have[d]++ }

func (v *nftView) remove(d Dest) {
	if v.have[d]--; v.have[d] <= 0 {
		delete(v.have, d)
	}
}

// dests keeps the IPv4 destinations (the harness's endpoints; Dest packs
// IPv4 only).
func dests(aps []netip.AddrPort) []Dest {
	var out []Dest
	for _, ap := range aps {
		if ap.Addr().Is4() {
			out = append(out, DestOf(ap))
		}
	}
	return out
}

// apply changes the view by one event of a committed transaction (or of a
// dump, as if added).
func (v *nftView) apply(ev nftEvent) {
	switch ev.kind {
	case nftMsgNewRule:
		k := nftRuleKey{ev.family, ev.table, ev.chain, ev.handle}
		v.dropRule(k)
		ds := dests(ev.dests)
		if len(ds) > 0 {
			v.rules[k] = ds
			for _, d := range ds {
				v.add(d)
			}
		}
	case nftMsgDelRule:
		v.dropRule(nftRuleKey{ev.family, ev.table, ev.chain, ev.handle})
	case nftMsgDelChain:
		for k := range v.rules {
			if k.family == ev.family && k.table == ev.table && k.chain == ev.chain {
				v.dropRule(k)
			}
		}
	case nftMsgNewSet:
		k := nftSetKey{ev.family, ev.table, ev.set}
		if s := v.sets[k]; s == nil || s.dnat != ev.dnat {
			v.dropSet(k)
			v.sets[k] = &nftSet{dnat: ev.dnat, elems: map[string]Dest{}}
		}
	case nftMsgDelSet:
		v.dropSet(nftSetKey{ev.family, ev.table, ev.set})
	case nftMsgNewSetElem, nftMsgDelSetElem:
		v.elems(ev)
	case nftMsgDelTable:
		v.dropTable(ev.family, ev.table)
	}
}

func (v *nftView) elems(ev nftEvent) {
	s := v.sets[nftSetKey{ev.family, ev.table, ev.set}]
	if s == nil || !s.dnat {
		return
	}
	for _, e := range ev.elems {
		if old, ok := s.elems[e.key]; ok {
			v.remove(old)
			delete(s.elems, e.key)
		}
		if ev.kind == nftMsgNewSetElem && e.dest.Addr().Is4() {
			d := DestOf(e.dest)
			s.elems[e.key] = d
			v.add(d)
		}
	}
}

func (v *nftView) dropRule(k nftRuleKey) {
	for _, d := range v.rules[k] {
		v.remove(d)
	}
	delete(v.rules, k)
}

func (v *nftView) dropSet(k nftSetKey) {
	if s := v.sets[k]; s != nil {
		for _, d := range s.elems {
			v.remove(d)
		}
	}
	delete(v.sets, k)
}

func (v *nftView) dropTable(family uint8, table string) {
	for k := range v.rules {
		if k.family == family && k.table == table {
			v.dropRule(k)
		}
	}
	for k := range v.sets {
		if k.family == family && k.table == table {
			v.dropSet(k)
		}
	}
}

// load fills v from dumps of every rule, every set and the elements of
// every DNAT map, in all families.
func (k *nftKernel) load(v *nftView) error {
	v.reset()
	for _, typ := range []int{nftMsgGetRule, nftMsgGetSet} {
		evs, err := k.dumpAll(typ, unix.AF_UNSPEC, nil)
		if err != nil {
			return err
		}
		for _, ev := range evs {
			v.apply(ev)
		}
	}
	for key, s := range v.sets {
		if !s.dnat {
			continue
		}
		ae := netlink.NewAttributeEncoder()
		ae.String(nftaSetElemListTable, key.table)
		ae.String(nftaSetElemListSet, key.set)
		attrs, err := ae.Encode()
		if err != nil {
			return err
		}
		evs, err := k.dumpAll(nftMsgGetSetElem, key.family, attrs)
		if err != nil {
			return err
		}
		for _, ev := range evs {
			v.apply(ev)
		}
	}
	return nil
}

// dumpAll sends an NLM_F_DUMP request and decodes the answers as the
// events of what they hold (GETRULE answers NEWRULE, and so on).
func (k *nftKernel) dumpAll(typ int, family uint8, attrs []byte) ([]nftEvent, error) {
	msgs, err := k.c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(nfnlSubsysNFTables<<8 | typ), Flags: netlink.Request | netlink.Dump},
		Data:   append(nfgen(family), attrs...),
	})
	if err != nil {
		return nil, fmt.Errorf("bench: nf_tables dump (message %d): %w", typ, err)
	}
	var out []nftEvent
	for _, m := range msgs {
		ev, ok, err := parseNFT(int(m.Header.Type&0xff), m.Data)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, ev)
		}
	}
	return out, nil
}
