// The typed values edgeproxy writes: chains (tableChain), rules (typed
// matches, a comment and one target) and jumps from built-in chains. A
// rule is turned into text for iptables-restore and into argv for
// go-iptables by the same code, so the two never disagree.

package iptables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
)

// tableChain names a chain in a table.
type tableChain struct{ table, name string }

// builtin reports whether name is a chain of the kernel's (PREROUTING,
// INPUT, ...), not one we create.
func builtin(name string) bool {
	switch name {
	case "PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING":
		return true
	}
	return false
}

// validate checks the table and the chain name (see validChainName).
func (c tableChain) validate() error {
	if c.table != tableNAT && c.table != tableFilter {
		return fmt.Errorf("chain %s: unknown table %q", c.name, c.table)
	}
	if builtin(c.name) {
		return nil
	}
	return validChainName(c.name)
}

// matchKind is the closed set of matches edgeproxy writes.
type matchKind uint8

const (
	mSrc        matchKind = iota + 1 // -s PREFIX
	mDst                             // -d PREFIX
	mProto                           // -p PROTO [-m PROTO --dport PORT]
	mAddrType                        // -m addrtype --src-type/--dst-type LOCAL
	mCtState                         // -m conntrack --ctstate STATES
	mCtOrigDst                       // -m conntrack --ctorigdst ADDR --ctorigdstport PORT --ctproto PROTO
	mMark                            // -m mark --mark M/M
	mStatistic                       // -m statistic --mode random --probability P
	mRecentSeen                      // -m recent --name N --rcheck --seconds S --reap
	mRecentSet                       // -m recent --name N --set --rsource
)

// match is one match of a rule; which fields count depends on kind. Build
// it with the functions below.
type match struct {
	kind   matchKind
	not    bool
	src    bool         // mAddrType: the source, not the destination
	port   uint16       // mProto (0: no port match), mCtOrigDst
	prefix netip.Prefix // mSrc, mDst; mCtOrigDst: the address (all bits)
	name   string       // mProto, mCtOrigDst: the protocol ("tcp", "udp", "sctp"); mCtState: the states; mRecent*: the list
	n      int64        // mMark: the mark; mRecentSeen: seconds
	prob   float64      // mStatistic
}

func srcIn(p netip.Prefix) match     { return match{kind: mSrc, prefix: p} }
func srcNotIn(p netip.Prefix) match  { return match{kind: mSrc, prefix: p, not: true} }
func dstIn(p netip.Prefix) match     { return match{kind: mDst, prefix: p} }
func dstNotIn(p netip.Prefix) match  { return match{kind: mDst, prefix: p, not: true} }
func dstHost(a netip.Addr) match     { return dstIn(netip.PrefixFrom(a, a.BitLen())) }
func srcHost(a netip.Addr) match     { return srcIn(netip.PrefixFrom(a, a.BitLen())) }
func protoIs(proto string) match     { return match{kind: mProto, name: proto} }
func srcLocal() match                { return match{kind: mAddrType, src: true} }
func dstLocal() match                { return match{kind: mAddrType} }
func ctState(states string) match    { return match{kind: mCtState, name: states} }
func ctStateNot(states string) match { return match{kind: mCtState, name: states, not: true} }
func markSet(m uint32) match         { return match{kind: mMark, n: int64(m)} }
func markNotSet(m uint32) match      { return match{kind: mMark, n: int64(m), not: true} }
func probability(p float64) match    { return match{kind: mStatistic, prob: p} }

func dport(proto string, port uint16) match { return match{kind: mProto, name: proto, port: port} }

func ctOrigDst(a netip.Addr, port uint16, proto string) match {
	return match{kind: mCtOrigDst, prefix: netip.PrefixFrom(a, a.BitLen()), port: port, name: proto}
}

func recentSeen(list string, secs int64) match {
	return match{kind: mRecentSeen, name: list, n: secs}
}

func recentSet(list string) match { return match{kind: mRecentSet, name: list} }

func (m *match) validate() error {
	switch m.kind {
	case mSrc, mDst:
		if !m.prefix.IsValid() {
			return errors.New("invalid address prefix")
		}
	case mProto, mCtOrigDst:
		if m.name != "tcp" && m.name != "udp" && m.name != "sctp" {
			return fmt.Errorf("unknown protocol %q", m.name)
		}
		if m.kind == mCtOrigDst && (!m.prefix.IsValid() || m.port == 0) {
			return errors.New("conntrack original destination without address or port")
		}
	case mCtState:
		if m.name == "" {
			return errors.New("conntrack match without states")
		}
	case mStatistic:
		if !(m.prob >= 0 && m.prob <= 1) {
			return fmt.Errorf("probability %v out of [0, 1]", m.prob)
		}
	case mRecentSeen, mRecentSet:
		if err := validChainName(m.name); err != nil {
			return fmt.Errorf("recent list: %w", err)
		}
	case mAddrType, mMark:
	default:
		return fmt.Errorf("unknown match kind %d", m.kind)
	}
	return nil
}

// args writes the match's arguments to w.
func (m *match) args(w *argWriter) {
	if m.not && (m.kind == mSrc || m.kind == mDst) {
		w.arg("!")
	}
	switch m.kind {
	case mSrc:
		w.arg("-s")
		w.prefix(m.prefix)
	case mDst:
		w.arg("-d")
		w.prefix(m.prefix)
	case mProto:
		w.args("-p", m.name)
		if m.port != 0 {
			w.args("-m", m.name, "--dport")
			w.uint(uint64(m.port), 10)
		}
	case mAddrType:
		if m.src {
			w.args("-m", "addrtype", "--src-type", "LOCAL")
		} else {
			w.args("-m", "addrtype", "--dst-type", "LOCAL")
		}
	case mCtState:
		w.args("-m", "conntrack")
		if m.not {
			w.arg("!")
		}
		w.args("--ctstate", m.name)
	case mCtOrigDst:
		w.args("-m", "conntrack", "--ctorigdst")
		w.addr(m.prefix.Addr())
		w.arg("--ctorigdstport")
		w.uint(uint64(m.port), 10)
		w.args("--ctproto", m.name)
	case mMark:
		w.args("-m", "mark")
		if m.not {
			w.arg("!")
		}
		w.arg("--mark")
		w.mask(uint32(m.n), true)
	case mStatistic:
		w.args("-m", "statistic", "--mode", "random", "--probability")
		w.probability(m.prob)
	case mRecentSeen:
		w.args("-m", "recent", "--name", m.name, "--rcheck", "--seconds")
		w.uint(uint64(m.n), 10)
		w.arg("--reap")
	case mRecentSet:
		w.args("-m", "recent", "--name", m.name, "--set", "--rsource")
	}
}

// targetKind is the closed set of targets edgeproxy writes.
type targetKind uint8

const (
	tJump       targetKind = iota + 1 // -j CHAIN
	tDNAT                             // -j DNAT --to-destination ADDR:PORT
	tMarkOr                           // -j MARK --or-mark M
	tMarkXor                          // -j MARK --xor-mark M
	tMasquerade                       // -j MASQUERADE [--random-fully]
	tReturn
	tAccept
	tDrop
	tReject
)

// target is what a rule does with a matching packet.
type target struct {
	kind        targetKind
	chain       string         // tJump
	to          netip.AddrPort // tDNAT
	mark        uint32         // tMarkOr, tMarkXor
	randomFully bool           // tMasquerade
}

func jumpTo(chain string) target         { return target{kind: tJump, chain: chain} }
func dnatTo(to netip.AddrPort) target    { return target{kind: tDNAT, to: to} }
func masquerade(randomFully bool) target { return target{kind: tMasquerade, randomFully: randomFully} }
func verdict(k targetKind) target        { return target{kind: k} }
func markOr(m uint32) target             { return target{kind: tMarkOr, mark: m} }
func markXor(m uint32) target            { return target{kind: tMarkXor, mark: m} }
func (t *target) name() string {
	var w argWriter
	t.args(&w)
	return w.argv[1]
}
func (t *target) jumps(chain string) bool { return t.kind == tJump && t.chain == chain }

func (t *target) validate() error {
	switch t.kind {
	case tJump:
		if builtin(t.chain) {
			return fmt.Errorf("jump to built-in chain %s", t.chain)
		}
		return validChainName(t.chain)
	case tDNAT:
		if !t.to.IsValid() || t.to.Port() == 0 {
			return fmt.Errorf("DNAT to invalid destination %s", t.to)
		}
	case tMarkOr, tMarkXor:
		if t.mark == 0 {
			return errors.New("MARK with an empty mark")
		}
	case tMasquerade, tReturn, tAccept, tDrop, tReject:
	default:
		return fmt.Errorf("unknown target kind %d", t.kind)
	}
	return nil
}

func (t *target) args(w *argWriter) {
	switch t.kind {
	case tJump:
		w.args("-j", t.chain)
	case tDNAT:
		w.args("-j", "DNAT", "--to-destination")
		w.addrPort(t.to)
	case tMarkOr:
		w.args("-j", "MARK", "--or-mark")
		w.mask(t.mark, false)
	case tMarkXor:
		w.args("-j", "MARK", "--xor-mark")
		w.mask(t.mark, false)
	case tMasquerade:
		w.args("-j", "MASQUERADE")
		if t.randomFully {
			w.arg("--random-fully")
		}
	case tReturn:
		w.args("-j", "RETURN")
	case tAccept:
		w.args("-j", "ACCEPT")
	case tDrop:
		w.args("-j", "DROP")
	case tReject:
		w.args("-j", "REJECT")
	}
}

// rule is one rule: matches in the order written, an optional comment
// (written after them) and a target.
type rule struct {
	matches []match
	comment string
	target  target
}

// maxComment is the longest comment xt_comment keeps (256 with its NUL).
const maxComment = 255

func (r *rule) validate() error {
	for i := range r.matches {
		if err := r.matches[i].validate(); err != nil {
			return err
		}
	}
	if len(r.comment) > maxComment || strings.ContainsFunc(r.comment, func(c rune) bool { return c == '"' || c == '\\' || c < ' ' || c > '~' }) {
		return fmt.Errorf("comment %q: longer than %d or not printable ASCII without quotes", r.comment, maxComment)
	}
	return r.target.validate()
}

// args returns the rule as the arguments of an iptables command after
// "-A CHAIN" (go-iptables' rulespec).
func (r *rule) args() []string {
	w := argWriter{argv: make([]string, 0, 16)}
	r.write(&w)
	return w.argv
}

// text is the rule as iptables-restore reads it after "-A CHAIN ".
func (r *rule) text() string {
	w := argWriter{mode: asText}
	r.write(&w)
	return string(w.b)
}

// write writes the rule's arguments to w.
func (r *rule) write(w *argWriter) {
	for i := range r.matches {
		r.matches[i].args(w)
	}
	if r.comment != "" {
		w.args("-m", "comment", "--comment")
		w.quoted(r.comment)
	}
	r.target.args(w)
}

// argWriter collects a rule's arguments as argv (go-iptables), as
// restore text (appended to b, space-separated, the comment in double
// quotes), or in a compact binary form for digests: one writer, so the
// forms cannot disagree.
type argWriter struct {
	mode argMode
	b    []byte
	argv []string
	n    int // arguments written
}

type argMode uint8

const (
	asArgv   argMode = iota
	asText           // iptables-restore syntax
	asDigest         // unambiguous bytes, cheaper than text: only hashed
)

// sep starts an argument in text mode, ends one in digest mode.
func (w *argWriter) sep() {
	switch {
	case w.mode == asDigest:
		w.b = append(w.b, 0)
	case w.n > 0:
		w.b = append(w.b, ' ')
	}
	w.n++
}

func (w *argWriter) arg(s string) {
	if w.mode == asArgv {
		w.argv = append(w.argv, s)
		return
	}
	w.sep()
	w.b = append(w.b, s...)
}

func (w *argWriter) args(ss ...string) {
	for _, s := range ss {
		w.arg(s)
	}
}

func (w *argWriter) quoted(s string) {
	if w.mode != asText {
		w.arg(s)
		return
	}
	w.sep()
	w.b = append(append(append(w.b, '"'), s...), '"')
}

// appendArg writes an argument that text formats (as argv or text) or
// bin encodes (for a digest).
func (w *argWriter) appendArg(text, bin func([]byte) []byte) {
	switch w.mode {
	case asArgv:
		w.argv = append(w.argv, string(text(nil)))
	case asText:
		w.sep()
		w.b = text(w.b)
	case asDigest:
		w.sep()
		w.b = bin(w.b)
	}
}

func (w *argWriter) prefix(p netip.Prefix) {
	w.appendArg(func(b []byte) []byte { b, _ = p.AppendText(b); return b },
		func(b []byte) []byte { b, _ = p.AppendBinary(b); return b })
}

func (w *argWriter) addr(a netip.Addr) {
	w.appendArg(func(b []byte) []byte { b, _ = a.AppendText(b); return b },
		func(b []byte) []byte { b, _ = a.AppendBinary(b); return b })
}

func (w *argWriter) addrPort(a netip.AddrPort) {
	w.appendArg(func(b []byte) []byte { b, _ = a.AppendText(b); return b },
		func(b []byte) []byte { b, _ = a.AppendBinary(b); return b })
}

func (w *argWriter) uint(n uint64, base int) {
	w.appendArg(func(b []byte) []byte { return strconv.AppendUint(b, n, base) },
		func(b []byte) []byte { return binary.AppendUvarint(b, n) })
}

// mask writes a mark as 0xHEX, or 0xHEX/0xHEX.
func (w *argWriter) mask(m uint32, withMask bool) {
	w.appendArg(func(b []byte) []byte {
		b = strconv.AppendUint(append(b, "0x"...), uint64(m), 16)
		if withMask {
			b = strconv.AppendUint(append(b, "/0x"...), uint64(m), 16)
		}
		return b
	}, func(b []byte) []byte {
		if withMask {
			b = append(b, '/')
		}
		return binary.AppendUvarint(b, uint64(m))
	})
}

func (w *argWriter) probability(p float64) {
	w.appendArg(func(b []byte) []byte { return appendProbability(b, p) },
		func(b []byte) []byte { return binary.LittleEndian.AppendUint64(b, math.Float64bits(p)) })
}

// jump is a rule in a built-in chain that leads to one of ours (or, for
// the sentinels, any rule that must be present).
type jump struct {
	table, chain string
	rule         rule
}

// target returns the chain the jump leads to (or its verdict).
func (j *jump) to() string { return j.rule.target.name() }
