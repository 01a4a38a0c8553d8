package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The native floor of a proxy that writes nf_tables over netlink
// (edgeproxy-nftables): its tables, read back over netlink from the node
// namespace, written again into an empty namespace as one batch of raw
// messages, one sendmsg. Nothing of either proxy's code is in it: the
// messages are the kernel's own dumps turned into requests, so the floor
// is what the kernel takes to commit the same objects.

// nf_tables request and dump message types, and the attributes a dump
// carries that a request must not (handles, use counts, positions).
const (
	nftMsgGetTable = 1
	nftMsgNewChain = 3
	nftMsgGetChain = 4

	nftaTableFlags     = 2
	nftaTableUserdata  = 6
	nftaChainHandle    = 2
	nftaChainUse       = 6
	nftaChainCounters  = 8
	nftaChainFlags     = 10
	nftaRulePosition   = 6
	nftaRulePad        = 8
	nftaSetID          = 10
	nftaSetUserdata    = 13
	nftaSetObjType     = 15
	nftaSetExpr        = 17
	nftaSetExpressions = 18

	nftaSetFlags  = 3
	nftaLookupSet = 1

	nftChainBase    = 1 // NFT_CHAIN_BASE: set by the kernel for hooked chains
	nftSetAnonymous = 1 // NFT_SET_ANONYMOUS

	nfnlMsgBatchBegin = 0x10
	nfnlMsgBatchEnd   = 0x11
	nlaTypeMask       = 0x3fff // without NLA_F_NESTED and NLA_F_NET_BYTEORDER
)

// nftCopy is one table as the requests that write it again: the table,
// its chains, its sets, their elements and its rules, in an order the
// kernel accepts in one batch (a verdict map's elements name chains, a
// rule names sets and chains).
type nftCopy struct {
	family uint8
	table  string
	msgs   []rawMsg
	// rules of each chain, to copy one chain under another name (the
	// one-change floor), and the anonymous sets they look up (by name),
	// copied with them: a rule's anonymous set binds to that rule only.
	rules map[string][]rawMsg
	anon  map[string]anonCopy
	// copies counts the anonymous sets chainAs copied, for their names.
	copies int
}

// anonCopy is an anonymous set as requests: the set without its ID, and
// its elements' lists (chainAs names both anew).
type anonCopy struct {
	set   []byte
	elems [][]byte
}

// readNFTTables reads every table of family whose name is prefix or
// starts with prefix + "-" (edgeproxy's main table and its service
// tables), in the order the kernel lists them.
func readNFTTables(c *netlink.Conn, family uint8, prefix string) ([]*nftCopy, error) {
	tables, err := rawDump(c, nftMsgGetTable, family, nil)
	if err != nil {
		return nil, err
	}
	var out []*nftCopy
	for _, m := range tables {
		name := attrString(m.Data, nftaTableName)
		if name != prefix && !strings.HasPrefix(name, prefix+"-") {
			continue
		}
		cp, err := readNFTTable(c, family, name)
		if err != nil {
			return nil, err
		}
		out = append(out, cp)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("bench: no nf_tables table %d %s", family, prefix)
	}
	return out, nil
}

// rawMsg is one nf_tables request: its type (without the subsystem),
// flags and data (nfgenmsg and attributes).
type rawMsg struct {
	typ   int
	flags netlink.HeaderFlags
	data  []byte
}

// readNFTTable reads family's table over c (a socket in the namespace
// that holds it).
func readNFTTable(c *netlink.Conn, family uint8, table string) (*nftCopy, error) {
	cp := &nftCopy{family: family, table: table, rules: map[string][]rawMsg{}, anon: map[string]anonCopy{}}
	byName := func(typ, attr int) ([]netlink.Message, error) {
		ae := netlink.NewAttributeEncoder()
		ae.String(uint16(attr), table)
		b, err := ae.Encode()
		if err != nil {
			return nil, err
		}
		return rawDump(c, typ, family, b)
	}
	tables, err := rawDump(c, nftMsgGetTable, family, nil)
	if err != nil {
		return nil, err
	}
	found := false
	for _, m := range tables {
		if attrString(m.Data, nftaTableName) == table {
			cp.add(nftMsgNewTable, netlink.Create, keepAttrs(m.Data, nftaTableName, nftaTableFlags, nftaTableUserdata))
			found = true
		}
	}
	if !found {
		return nil, fmt.Errorf("bench: no nf_tables table %d %s", family, table)
	}
	chains, err := byName(nftMsgGetChain, nftaChainTable)
	if err != nil {
		return nil, err
	}
	for _, m := range chains {
		if attrString(m.Data, nftaChainTable) != table {
			continue
		}
		cp.add(nftMsgNewChain, netlink.Create, chainRequest(m.Data))
	}
	sets, err := byName(nftMsgGetSet, nftaSetTable)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, m := range sets {
		if attrString(m.Data, nftaSetTable) != table {
			continue
		}
		// What a request may carry, without the dump's handle and
		// what newer kernels add to dumps only (the backend's name,
		// the element count); a request must have an ID of its own.
		data := filterAttrs(m.Data, func(t uint16) bool {
			return t >= nftaSetTable && t <= nftaSetUserdata && t != nftaSetID || t == nftaSetObjType || t == nftaSetExpr || t == nftaSetExpressions
		})
		cp.add(nftMsgNewSet, netlink.Create, appendAttr(data, nftaSetID, binary.BigEndian.AppendUint32(nil, uint32(len(names)+1))))
		names = append(names, attrString(m.Data, nftaSetName))
		if attrUint32(m.Data, nftaSetFlags)&nftSetAnonymous != 0 {
			cp.anon[names[len(names)-1]] = anonCopy{set: data}
		}
	}
	for _, set := range names {
		ae := netlink.NewAttributeEncoder()
		ae.String(nftaSetElemListTable, table)
		ae.String(nftaSetElemListSet, set)
		b, err := ae.Encode()
		if err != nil {
			return nil, err
		}
		elems, err := rawDump(c, nftMsgGetSetElem, family, b)
		if err != nil {
			return nil, err
		}
		for _, m := range elems {
			cp.add(nftMsgNewSetElem, netlink.Create, m.Data)
			if a, ok := cp.anon[set]; ok {
				a.elems = append(a.elems, m.Data)
				cp.anon[set] = a
			}
		}
	}
	rules, err := byName(nftMsgGetRule, nftaRuleTable)
	if err != nil {
		return nil, err
	}
	for _, m := range rules {
		if attrString(m.Data, nftaRuleTable) != table {
			continue
		}
		r := rawMsg{nftMsgNewRule, netlink.Create | netlink.Append, dropAttrs(m.Data, nftaRuleHandle, nftaRulePosition, nftaRulePad)}
		cp.msgs = append(cp.msgs, r)
		chain := attrString(m.Data, nftaRuleChain)
		cp.rules[chain] = append(cp.rules[chain], r)
	}
	return cp, nil
}

func (cp *nftCopy) add(typ int, flags netlink.HeaderFlags, data []byte) {
	cp.msgs = append(cp.msgs, rawMsg{typ, flags, data})
}

// chainAs is the requests that add a new chain named name holding the
// rules of chain from.
func (cp *nftCopy) chainAs(from, name string) []rawMsg {
	ae := netlink.NewAttributeEncoder()
	ae.String(nftaChainTable, cp.table)
	ae.String(nftaChainName, name)
	b, _ := ae.Encode()
	out := []rawMsg{{nftMsgNewChain, netlink.Create, append(nfgen(cp.family), b...)}}
	for _, r := range cp.rules[from] {
		attrs := renameLookups(r.data[4:], func(set string) (string, bool) {
			a, ok := cp.anon[set]
			if !ok {
				return "", false
			}
			cp.copies++
			n := fmt.Sprintf("__floor%d", cp.copies)
			out = append(out, rawMsg{nftMsgNewSet, netlink.Create,
				appendAttr(append(nfgen(cp.family), setAttrString(a.set[4:], nftaSetName, n)...), nftaSetID, binary.BigEndian.AppendUint32(nil, uint32(1<<20+cp.copies)))})
			for _, e := range a.elems {
				out = append(out, rawMsg{nftMsgNewSetElem, netlink.Create, append(nfgen(cp.family), setAttrString(e[4:], nftaSetElemListSet, n)...)})
			}
			return n, true
		})
		data := append(nfgen(cp.family), setAttrString(attrs, nftaRuleChain, name)...)
		out = append(out, rawMsg{r.typ, r.flags, data})
	}
	return out
}

// renameLookups is a rule's attributes with every lookup of a set that
// rename renames naming the new set instead (a dumped lookup names its
// set, it has no set ID): rule expressions → each expression → a lookup's
// data → its set's name.
func renameLookups(attrs []byte, rename func(string) (string, bool)) []byte {
	return mapAttrs(attrs, func(t uint16, exprs []byte) []byte {
		if t&nlaTypeMask != nftaRuleExprs {
			return exprs
		}
		return mapNested(exprs, func(_ uint16, elem []byte) []byte {
			if attrString(append(nfgen(0), attrValue(elem)...), nftaExprName) != "lookup" {
				return elem
			}
			return mapNested(elem, func(t uint16, data []byte) []byte {
				if t&nlaTypeMask != nftaExprData {
					return data
				}
				return mapNested(data, func(t uint16, a []byte) []byte {
					if t&nlaTypeMask == nftaLookupSet {
						if n, ok := rename(cstring(attrValue(a))); ok {
							return appendAttr(nil, t, append([]byte(n), 0))
						}
					}
					return a
				})
			})
		})
	})
}

// mapAttrs is the attributes b, each replaced by fn(its type, its whole
// aligned bytes).
func mapAttrs(b []byte, fn func(typ uint16, raw []byte) []byte) []byte {
	var out []byte
	eachRawFull(b, func(t uint16, raw []byte) { out = append(out, fn(t, raw)...) })
	return out
}

// mapNested is the nested attribute raw with its attributes mapped by fn.
func mapNested(raw []byte, fn func(typ uint16, raw []byte) []byte) []byte {
	return appendAttr(nil, binary.NativeEndian.Uint16(raw[2:]), mapAttrs(attrValue(raw), fn))
}

// attrValue is the value of the attribute raw (its header dropped, and
// the padding).
func attrValue(raw []byte) []byte { return raw[4:binary.NativeEndian.Uint16(raw)] }

// dialNFT opens a netfilter netlink socket in the calling thread's
// namespace.
func dialNFT() (*netlink.Conn, error) { return netlink.Dial(unix.NETLINK_NETFILTER, nil) }

// rawDump sends a dump request and returns the answers.
func rawDump(c *netlink.Conn, typ int, family uint8, attrs []byte) ([]netlink.Message, error) {
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(nfnlSubsysNFTables<<8 | typ), Flags: netlink.Request | netlink.Dump},
		Data:   append(nfgen(family), attrs...),
	})
	if err != nil {
		return nil, fmt.Errorf("bench: nf_tables dump (message %d): %w", typ, err)
	}
	return msgs, nil
}

// chainRequest is a dumped chain as a request: no handle, use count or
// counters, and the flags without the one the kernel sets itself.
func chainRequest(data []byte) []byte {
	out := dropAttrs(data, nftaChainHandle, nftaChainUse, nftaChainCounters, nftaChainFlags)
	var flags uint32
	eachRaw(data[4:], func(typ uint16, v []byte) {
		if typ == nftaChainFlags && len(v) == 4 {
			flags = binary.BigEndian.Uint32(v) &^ nftChainBase
		}
	})
	if flags != 0 {
		out = appendAttr(out, nftaChainFlags, binary.BigEndian.AppendUint32(nil, flags))
	}
	return out
}

// eachRaw calls fn for each top-level attribute of b, with its type
// (flags masked) and value.
func eachRaw(b []byte, fn func(typ uint16, v []byte)) {
	for len(b) >= 4 {
		n := int(binary.NativeEndian.Uint16(b))
		if n < 4 || n > len(b) {
			return
		}
		fn(binary.NativeEndian.Uint16(b[2:])&nlaTypeMask, b[4:n])
		a := nlmsgAlign(n)
		if a > len(b) {
			return
		}
		b = b[a:]
	}
}

// filterAttrs copies data (nfgenmsg and attributes) with the attributes
// keep accepts, bytes unchanged (nested flags included).
func filterAttrs(data []byte, keep func(uint16) bool) []byte {
	out := append([]byte(nil), data[:4]...)
	b := data[4:]
	for len(b) >= 4 {
		n := int(binary.NativeEndian.Uint16(b))
		if n < 4 || n > len(b) {
			break
		}
		a := min(nlmsgAlign(n), len(b))
		if keep(binary.NativeEndian.Uint16(b[2:]) & nlaTypeMask) {
			out = append(out, b[:a]...)
			for len(out)%4 != 0 {
				out = append(out, 0)
			}
		}
		b = b[a:]
	}
	return out
}

func dropAttrs(data []byte, types ...uint16) []byte {
	return filterAttrs(data, func(t uint16) bool {
		for _, d := range types {
			if t == d {
				return false
			}
		}
		return true
	})
}

func keepAttrs(data []byte, types ...uint16) []byte {
	return filterAttrs(data, func(t uint16) bool {
		for _, k := range types {
			if t == k {
				return true
			}
		}
		return false
	})
}

func appendAttr(b []byte, typ uint16, v []byte) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(4+len(v)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, v...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// setAttrString is attrs with the string attribute typ set to s.
func setAttrString(attrs []byte, typ uint16, s string) []byte {
	var out []byte
	eachRawFull(attrs, func(t uint16, raw []byte) {
		if t&nlaTypeMask == typ {
			out = appendAttr(out, typ, append([]byte(s), 0))
			return
		}
		out = append(out, raw...)
	})
	return out
}

// eachRawFull is eachRaw with each attribute's whole aligned bytes.
func eachRawFull(b []byte, fn func(typ uint16, raw []byte)) {
	for len(b) >= 4 {
		n := int(binary.NativeEndian.Uint16(b))
		if n < 4 || n > len(b) {
			return
		}
		a := min(nlmsgAlign(n), len(b))
		fn(binary.NativeEndian.Uint16(b[2:]), b[:a])
		b = b[a:]
	}
}

func attrString(data []byte, typ uint16) string {
	var s string
	if len(data) < 4 {
		return ""
	}
	eachRaw(data[4:], func(t uint16, v []byte) {
		if t == typ {
			s = cstring(v)
		}
	})
	return s
}

func attrUint32(data []byte, typ uint16) uint32 {
	var u uint32
	if len(data) < 4 {
		return 0
	}
	eachRaw(data[4:], func(t uint16, v []byte) {
		if t == typ && len(v) == 4 {
			u = binary.BigEndian.Uint32(v)
		}
	})
	return u
}

// nftBatch is a batch of requests marshalled for one sendmsg.
type nftBatch []byte

// marshalBatch frames msgs as one nf_tables batch, the last request
// asking for an acknowledgement (errors are reported anyway).
func marshalBatch(msgs []rawMsg) nftBatch {
	var b []byte
	seq := uint32(1)
	put := func(typ uint16, flags netlink.HeaderFlags, data []byte) {
		b = binary.NativeEndian.AppendUint32(b, uint32(nlmsgHdrLen+len(data)))
		b = binary.NativeEndian.AppendUint16(b, typ)
		b = binary.NativeEndian.AppendUint16(b, uint16(flags))
		b = binary.NativeEndian.AppendUint32(b, seq)
		b = binary.NativeEndian.AppendUint32(b, 0)
		b = append(b, data...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		seq++
	}
	begin := []byte{unix.AF_UNSPEC, 0, 0, nfnlSubsysNFTables} // res_id, big-endian
	put(nfnlMsgBatchBegin, netlink.Request, begin)
	for i, m := range msgs {
		flags := netlink.Request | m.flags
		if i == len(msgs)-1 {
			flags |= netlink.Acknowledge
		}
		put(uint16(nfnlSubsysNFTables<<8|m.typ), flags, m.data)
	}
	put(nfnlMsgBatchEnd, netlink.Request, begin)
	return b
}

// sendBatch opens a netfilter socket in the calling thread's namespace,
// sends b in one sendmsg and waits for the kernel's answer: the time from
// the send until the acknowledgement of the committed batch.
func sendBatch(b nftBatch) (time.Duration, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, len(b)+1<<20); err != nil {
		return 0, err
	}
	// The kernel says why it refuses a message, and which attribute.
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, err
	}
	buf := make([]byte, 1<<16)
	start := time.Now()
	if err := unix.Sendto(fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("bench: send an nf_tables batch of %d bytes: %w", len(b), err)
	}
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return 0, fmt.Errorf("bench: nf_tables batch answer: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return 0, err
		}
		for _, m := range msgs {
			if m.Header.Type != unix.NLMSG_ERROR || len(m.Data) < 4 {
				continue
			}
			if code := int32(binary.NativeEndian.Uint32(m.Data)); code != 0 {
				return 0, fmt.Errorf("bench: nf_tables batch, message %d%s: %w", m.Header.Seq, extAck(m), unix.Errno(-code))
			}
			return time.Since(start), nil // the acknowledgement of the last request
		}
	}
}

// nftFloor measures, for a proxy with tables of its own (both families:
// table and every table named table-*, edgeproxy's service tables), one
// batch of all of them into an empty namespace watched as the proxies'
// runs are (watched), the median of floorRuns, then the median of five
// one-chain batches on top of the last (a copy of one of its Service
// chains, in that chain's table). It returns the bytes of the full batch.
func (r *Runner) nftFloor(res *Result, table, svcPrefix string) (int, error) {
	var copies []*nftCopy
	err := r.World.Node.Do(func() error {
		c, err := dialNFT()
		if err != nil {
			return err
		}
		defer c.Close()
		for _, fam := range []uint8{nfprotoIPv4, nfprotoIPv6} {
			cps, err := readNFTTables(c, fam, table)
			if err != nil && fam == nfprotoIPv6 {
				continue // IPv4 only
			}
			if err != nil {
				return err
			}
			copies = append(copies, cps...)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	var all []rawMsg
	for _, cp := range copies {
		all = append(all, cp.msgs...)
	}
	full := marshalBatch(all)
	var svc string
	var in *nftCopy // the table of svc
	for _, cp := range copies {
		if cp.family != copies[0].family {
			continue
		}
		for chain := range cp.rules {
			if len(chain) > len(svcPrefix) && chain[:len(svcPrefix)] == svcPrefix && (svc == "" || chain < svc) {
				svc, in = chain, cp
			}
		}
	}
	if svc == "" {
		return 0, errors.New("bench: no service chain to copy for the one-change floor")
	}
	// The median of floorRuns batches, each into a namespace of its own;
	// all stay until the end, so that none is torn down (the kernel frees
	// a namespace's tables in the background) while another is timed.
	var fulls []float64
	for i := range floorRuns {
		ns, err := NewNetns(fmt.Sprintf("floor-%d", i))
		if err != nil {
			return 0, err
		}
		defer ns.Close()
		stop, err := watched(ns, "nft")
		if err != nil {
			return 0, err
		}
		err = ns.Do(func() error {
			d, err := sendBatch(full)
			if err != nil {
				return err
			}
			fulls = append(fulls, d.Seconds())
			if i < floorRuns-1 {
				return nil
			}
			var one []float64
			for j := range 5 {
				d, err := sendBatch(marshalBatch(in.chainAs(svc, fmt.Sprintf("epb-floor-%d", j+1))))
				if err != nil {
					return err
				}
				one = append(one, d.Seconds())
			}
			res.FloorOneChange = quantile(one, 0.5)
			return nil
		})
		stop()
		if err != nil {
			return 0, err
		}
	}
	res.FloorRestore = quantile(fulls, 0.5)
	return len(full), nil
}

// floorRuns is how many times the native floor's batch is timed: one
// batch into an empty namespace varied from 1.05 to 1.61 s at 5k Services
// between runs on this machine.
const floorRuns = 3

// extAck is the kernel's explanation of an error (NLMSGERR_ATTR_MSG, and
// the offset of the attribute it refused), when it gave one.
func extAck(m syscall.NetlinkMessage) string {
	if m.Header.Flags&unix.NLM_F_ACK_TLVS == 0 || len(m.Data) < 4+nlmsgHdrLen {
		return ""
	}
	// The error code, then the request's header (its payload only when
	// the socket did not ask for capped acks), then the TLVs.
	off := 4 + nlmsgHdrLen
	if m.Header.Flags&unix.NLM_F_CAPPED == 0 {
		off = 4 + int(binary.NativeEndian.Uint32(m.Data[4:]))
	}
	if off > len(m.Data) {
		return ""
	}
	var out string
	eachRaw(m.Data[nlmsgAlign(off):], func(typ uint16, v []byte) {
		switch typ {
		case unix.NLMSGERR_ATTR_MSG:
			out += " (" + cstring(v) + ")"
		case unix.NLMSGERR_ATTR_OFFS:
			if len(v) == 4 {
				out += fmt.Sprintf(" (at byte %d)", binary.NativeEndian.Uint32(v))
			}
		}
	})
	return out
}

// watched runs, in ns, the watch that every proxy's run is measured
// under (a Watcher over the nf_tables events) until the returned stop is
// called, so that a floor on nf_tables pays what the proxies pay for
// being watched: for each listener of NFNLGRP_NFTABLES the kernel builds
// an event of every object a transaction adds, in the commit the floor
// times (a cold start of 5k Services took 1.16–1.23 s with a listener
// draining the events and 1.08–1.19 s without, four rounds each, in
// datapath/nftables). x_tables (backend legacy) has no events: nothing
// is run there.
func watched(ns *Netns, backend string) (stop func(), err error) {
	if backend != "nft" {
		return func() {}, nil
	}
	k, err := ns.OpenKernel(backend)
	if err != nil {
		return nil, err
	}
	w := NewWatcher(k)
	ctx, cancel := context.WithCancel(context.Background())
	// The first poll reads the empty namespace, as at a proxy's start.
	if _, err := w.Poll(ctx); err != nil {
		cancel()
		w.Close()
		k.Close()
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			_, _ = w.Poll(ctx)
		}
	}()
	return func() {
		cancel()
		<-done
		w.Close()
		k.Close()
	}, nil
}
