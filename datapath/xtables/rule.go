// The typed values both modes write: chains, rules (typed matches, a
// comment and one target) and jumps from built-in chains. A rule is turned
// into text for iptables-restore, into argv for go-iptables and into
// bytes for a digest by the same code, so the forms never disagree.

package xtables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Tables edgeproxy writes to.
const (
	NAT    = "nat"
	Filter = "filter"
	Mangle = "mangle" // IPVS mode only
)

// MaxChainLen is the longest chain name iptables accepts (XT_EXTENSION_MAXNAMELEN
// minus the terminating NUL is 28 for user chains).
const MaxChainLen = 28

// maxSetName is the longest ipset name (IPSET_MAXNAMELEN minus the NUL).
const maxSetName = 31

// Chain names a chain in a table.
type Chain struct{ Table, Name string }

// Builtin reports whether name is a chain of the kernel's (PREROUTING,
// INPUT, ...), not one we create.
func Builtin(name string) bool {
	switch name {
	case "PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING":
		return true
	}
	return false
}

// Validate checks the table and the chain name (see ValidChainName).
func (c Chain) Validate() error {
	if c.Table != NAT && c.Table != Filter && c.Table != Mangle {
		return fmt.Errorf("chain %s: unknown table %q", c.Name, c.Table)
	}
	if Builtin(c.Name) {
		return nil
	}
	return ValidChainName(c.Name)
}

// ValidChainName checks a user chain name as iptables does: 1 to
// MaxChainLen printable ASCII characters without spaces or quotes, not
// starting with "-" or "!".
func ValidChainName(name string) error {
	if name == "" || len(name) > MaxChainLen {
		return fmt.Errorf("chain name %q: length %d not in 1..%d", name, len(name), MaxChainLen)
	}
	if name[0] == '-' || name[0] == '!' || strings.ContainsFunc(name, func(r rune) bool { return r <= ' ' || r > '~' || r == '"' || r == '\'' }) {
		return fmt.Errorf("chain name %q: not a valid iptables chain name", name)
	}
	return nil
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
	mSet                             // -m set --match-set NAME DIRS
	mInIface                         // -i NAME (a trailing + matches by prefix)
)

// Match is one match of a rule. Build it with the functions below; the
// zero Match is invalid.
type Match struct {
	kind   matchKind
	not    bool
	src    bool         // mAddrType: the source, not the destination
	dirs   uint8        // mSet: 1 + the index of its flags in setFlags (0: invalid); a byte keeps Match as small as it was without sets
	port   uint16       // mProto (0: no port match), mCtOrigDst
	prefix netip.Prefix // mSrc, mDst; mCtOrigDst: the address (all bits)
	name   string       // mProto, mCtOrigDst: the protocol ("tcp", "udp", "sctp"); mCtState: the states; mRecent*, mSet: the list; mInIface: the interface
	n      int64        // mMark: the mark; mRecentSeen: seconds
	prob   float64      // mStatistic
}

// setFlags are the flags of --match-set: one to three of src and dst,
// one per dimension of the set's type (hash:ip,port,ip: "dst,dst,src").
var setFlags = func() []string {
	out := []string{"src", "dst"}
	for _, n := range []int{2, 4} { // the flags of one and of two dimensions
		for _, f := range out[len(out)-n:] {
			out = append(out, f+",src", f+",dst")
		}
	}
	return out
}()

// setDirs is the dirs of a Match for flags.
func setDirs(flags string) uint8 { return uint8(slices.Index(setFlags, flags) + 1) }

// InIface matches packets that arrived on interface name (-i name); a
// name ending in "+" matches every interface whose name begins with the
// rest. Packets the node sends have arrived on none.
func InIface(name string) Match { return Match{kind: mInIface, name: name} }

// NotInIface matches packets that did not arrive on interface name
// (! -i name).
func NotInIface(name string) Match { return Match{kind: mInIface, name: name, not: true} }

// MaxIfaceName is the longest interface name (and -i argument) the
// kernel takes (IFNAMSIZ, 16 with its NUL).
const MaxIfaceName = 15

// ValidIface checks an interface name or a "prefix+" for -i: 1 to
// MaxIfaceName characters, none of them blank, '/' or ':', and no '+'
// but a last one (as the kernel's dev_valid_name).
func ValidIface(name string) error {
	base := strings.TrimSuffix(name, "+")
	if base == "" && name != "+" || len(name) > MaxIfaceName || base == "." || base == ".." ||
		strings.ContainsFunc(base, func(r rune) bool {
			return r <= ' ' || r > '~' || r == '/' || r == ':' || r == '+' || r == '"' || r == '!'
		}) {
		return fmt.Errorf("interface %q: not 1..%d printable characters without blanks, '/', ':', '!' or a '+' but a last one", name, MaxIfaceName)
	}
	return nil
}

// Src matches sources in p (-s p).
func Src(p netip.Prefix) Match { return Match{kind: mSrc, prefix: p} }

// NotSrc matches sources outside p (! -s p).
func NotSrc(p netip.Prefix) Match { return Match{kind: mSrc, prefix: p, not: true} }

// Dst matches destinations in p (-d p).
func Dst(p netip.Prefix) Match { return Match{kind: mDst, prefix: p} }

// NotDst matches destinations outside p (! -d p).
func NotDst(p netip.Prefix) Match { return Match{kind: mDst, prefix: p, not: true} }

// DstHost matches the destination a (-d a/32 or /128).
func DstHost(a netip.Addr) Match { return Dst(netip.PrefixFrom(a, a.BitLen())) }

// SrcHost matches the source a.
func SrcHost(a netip.Addr) Match { return Src(netip.PrefixFrom(a, a.BitLen())) }

// Proto matches the protocol ("tcp", "udp", "sctp").
func Proto(proto string) Match { return Match{kind: mProto, name: proto} }

// DPort matches the protocol and the destination port.
func DPort(proto string, port uint16) Match { return Match{kind: mProto, name: proto, port: port} }

// SrcLocal matches a source address of the node's (addrtype LOCAL).
func SrcLocal() Match { return Match{kind: mAddrType, src: true} }

// DstLocal matches a destination address of the node's.
func DstLocal() Match { return Match{kind: mAddrType} }

// CtState matches connections in one of the conntrack states (comma-separated).
func CtState(states string) Match { return Match{kind: mCtState, name: states} }

// NotCtState matches connections in none of the states.
func NotCtState(states string) Match { return Match{kind: mCtState, name: states, not: true} }

// Mark matches packets whose mark has every bit of m.
func Mark(m uint32) Match { return Match{kind: mMark, n: int64(m)} }

// NotMark matches packets whose mark lacks a bit of m.
func NotMark(m uint32) Match { return Match{kind: mMark, n: int64(m), not: true} }

// Probability matches a packet at random with probability p.
func Probability(p float64) Match { return Match{kind: mStatistic, prob: p} }

// CtOrigDst matches the connection's original destination (before DNAT).
func CtOrigDst(a netip.Addr, port uint16, proto string) Match {
	return Match{kind: mCtOrigDst, prefix: netip.PrefixFrom(a, a.BitLen()), port: port, name: proto}
}

// RecentSeen matches sources recorded in list within secs seconds.
func RecentSeen(list string, secs int64) Match {
	return Match{kind: mRecentSeen, name: list, n: secs}
}

// RecentSet records the source in list; it always matches.
func RecentSet(list string) Match { return Match{kind: mRecentSet, name: list} }

// InSet matches packets whose fields named by dirs ("dst,dst" is the
// destination address and port) are in ipset set.
func InSet(set, dirs string) Match { return Match{kind: mSet, name: set, dirs: setDirs(dirs)} }

// NotInSet matches packets whose fields are not in set.
func NotInSet(set, dirs string) Match {
	return Match{kind: mSet, name: set, dirs: setDirs(dirs), not: true}
}

func (m *Match) validate() error {
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
		if err := ValidChainName(m.name); err != nil {
			return fmt.Errorf("recent list: %w", err)
		}
	case mSet:
		if m.name == "" || len(m.name) > maxSetName || strings.ContainsFunc(m.name, func(r rune) bool { return r <= ' ' || r > '~' || r == '"' }) {
			return fmt.Errorf("set name %q: not 1..%d printable characters", m.name, maxSetName)
		}
		if m.dirs == 0 || int(m.dirs) > len(setFlags) {
			return fmt.Errorf("set %s: flags are not 1 to 3 of src and dst", m.name)
		}
	case mInIface:
		return ValidIface(m.name)
	case mAddrType, mMark:
	default:
		return fmt.Errorf("unknown match kind %d", m.kind)
	}
	return nil
}

// args writes the match's arguments to w.
func (m *Match) args(w *argWriter) {
	if m.not && (m.kind == mSrc || m.kind == mDst || m.kind == mInIface) {
		w.arg("!")
	}
	switch m.kind {
	case mInIface:
		w.args("-i", m.name)
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
	case mSet:
		w.args("-m", "set")
		if m.not {
			w.arg("!")
		}
		w.args("--match-set", m.name, setFlags[m.dirs-1])
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

// Target is what a rule does with a matching packet. Build it with the
// functions and values below; the zero Target is invalid.
type Target struct {
	kind        targetKind
	chain       string         // tJump
	to          netip.AddrPort // tDNAT
	mark        uint32         // tMarkOr, tMarkXor
	randomFully bool           // tMasquerade
}

// The verdicts.
var (
	Return = Target{kind: tReturn}
	Accept = Target{kind: tAccept}
	Drop   = Target{kind: tDrop}
	Reject = Target{kind: tReject}
)

// JumpTo jumps to a user chain.
func JumpTo(chain string) Target { return Target{kind: tJump, chain: chain} }

// DNAT rewrites the destination to to.
func DNAT(to netip.AddrPort) Target { return Target{kind: tDNAT, to: to} }

// Masquerade rewrites the source to the outgoing interface's address,
// with fully random source ports when randomFully.
func Masquerade(randomFully bool) Target { return Target{kind: tMasquerade, randomFully: randomFully} }

// MarkOr sets the bits of m in the packet mark.
func MarkOr(m uint32) Target { return Target{kind: tMarkOr, mark: m} }

// MarkXor flips the bits of m in the packet mark.
func MarkXor(m uint32) Target { return Target{kind: tMarkXor, mark: m} }

// Name is the target as -j names it: the chain jumped to, or DNAT,
// MARK, MASQUERADE, RETURN, ACCEPT, DROP, REJECT.
func (t *Target) Name() string {
	var w argWriter
	t.args(&w)
	return w.argv[1]
}

// Jumps reports whether t jumps to chain.
func (t *Target) Jumps(chain string) bool { return t.kind == tJump && t.chain == chain }

// DNATTo returns the destination of a DNAT target; false for the others.
func (t *Target) DNATTo() (netip.AddrPort, bool) { return t.to, t.kind == tDNAT }

func (t *Target) validate() error {
	switch t.kind {
	case tJump:
		if Builtin(t.chain) {
			return fmt.Errorf("jump to built-in chain %s", t.chain)
		}
		return ValidChainName(t.chain)
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

func (t *Target) args(w *argWriter) {
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

// Rule is one rule: matches in the order written, an optional comment
// (written after them) and a target.
type Rule struct {
	Matches []Match
	Comment string
	Target  Target
}

// MaxComment is the longest comment xt_comment keeps (256 with its NUL).
const MaxComment = 255

// Validate checks every match, the comment (printable ASCII without
// quotes or backslashes, at most MaxComment) and the target.
func (r *Rule) Validate() error {
	for i := range r.Matches {
		if err := r.Matches[i].validate(); err != nil {
			return err
		}
	}
	if len(r.Comment) > MaxComment || strings.ContainsFunc(r.Comment, func(c rune) bool { return c == '"' || c == '\\' || c < ' ' || c > '~' }) {
		return fmt.Errorf("comment %q: longer than %d or not printable ASCII without quotes", r.Comment, MaxComment)
	}
	return r.Target.validate()
}

// Args returns the rule as the arguments of an iptables command after
// "-A CHAIN" (go-iptables' rulespec).
func (r *Rule) Args() []string {
	w := argWriter{argv: make([]string, 0, 16)}
	r.write(&w)
	return w.argv
}

// Text is the rule as iptables-restore reads it after "-A CHAIN ".
func (r *Rule) Text() string {
	w := argWriter{mode: asText}
	r.write(&w)
	return string(w.b)
}

// AppendDigest appends an unambiguous binary form of the rule to b, for
// hashing: cheaper than the text, and equal only for equal rules.
func (r *Rule) AppendDigest(b []byte) []byte {
	w := argWriter{mode: asDigest, b: b}
	r.write(&w)
	return w.b
}

// write writes the rule's arguments to w.
func (r *Rule) write(w *argWriter) {
	for i := range r.Matches {
		r.Matches[i].args(w)
	}
	if r.Comment != "" {
		w.args("-m", "comment", "--comment")
		w.quoted(r.Comment)
	}
	r.Target.args(w)
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
	w.appendArg(func(b []byte) []byte { return strconv.AppendFloat(b, p, 'f', 10, 64) },
		func(b []byte) []byte { return binary.LittleEndian.AppendUint64(b, math.Float64bits(p)) })
}

// Jump is a rule in a built-in chain that leads to one of ours (or, for
// the sentinels, any rule that must be present).
type Jump struct {
	Table, Chain string
	Rule         Rule
}

// To returns the chain the jump leads to (or its verdict).
func (j *Jump) To() string { return j.Rule.Target.Name() }
