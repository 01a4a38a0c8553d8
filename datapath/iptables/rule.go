// The typed values edgeproxy writes: chains (tableChain), rules (typed
// matches, a comment and one target) and jumps from built-in chains. A
// rule is turned into text for iptables-restore and into argv for
// go-iptables by the same code, so the two never disagree.

package iptables

import (
	"errors"
	"fmt"
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
	src    bool // mAddrType: the source, not the destination
	prefix netip.Prefix
	addr   netip.Addr
	port   uint16
	proto  string // "tcp", "udp", "sctp"
	mark   uint32
	prob   float64
	secs   int64
	name   string // mCtState: the states; mRecent*: the list
}

func srcIn(p netip.Prefix) match     { return match{kind: mSrc, prefix: p} }
func srcNotIn(p netip.Prefix) match  { return match{kind: mSrc, prefix: p, not: true} }
func dstIn(p netip.Prefix) match     { return match{kind: mDst, prefix: p} }
func dstNotIn(p netip.Prefix) match  { return match{kind: mDst, prefix: p, not: true} }
func dstHost(a netip.Addr) match     { return dstIn(netip.PrefixFrom(a, a.BitLen())) }
func srcHost(a netip.Addr) match     { return srcIn(netip.PrefixFrom(a, a.BitLen())) }
func protoIs(proto string) match     { return match{kind: mProto, proto: proto} }
func srcLocal() match                { return match{kind: mAddrType, src: true} }
func dstLocal() match                { return match{kind: mAddrType} }
func ctState(states string) match    { return match{kind: mCtState, name: states} }
func ctStateNot(states string) match { return match{kind: mCtState, name: states, not: true} }
func markSet(m uint32) match         { return match{kind: mMark, mark: m} }
func markNotSet(m uint32) match      { return match{kind: mMark, mark: m, not: true} }
func probability(p float64) match    { return match{kind: mStatistic, prob: p} }

func dport(proto string, port uint16) match { return match{kind: mProto, proto: proto, port: port} }

func ctOrigDst(a netip.Addr, port uint16, proto string) match {
	return match{kind: mCtOrigDst, addr: a, port: port, proto: proto}
}

func recentSeen(list string, secs int64) match {
	return match{kind: mRecentSeen, name: list, secs: secs}
}

func recentSet(list string) match { return match{kind: mRecentSet, name: list} }

func (m *match) validate() error {
	switch m.kind {
	case mSrc, mDst:
		if !m.prefix.IsValid() {
			return errors.New("invalid address prefix")
		}
	case mProto, mCtOrigDst:
		if m.proto != "tcp" && m.proto != "udp" && m.proto != "sctp" {
			return fmt.Errorf("unknown protocol %q", m.proto)
		}
		if m.kind == mCtOrigDst && (!m.addr.IsValid() || m.port == 0) {
			return errors.New("conntrack original destination without address or port")
		}
	case mCtState:
		if m.name == "" {
			return errors.New("conntrack match without states")
		}
	case mStatistic:
		if !(m.prob > 0 && m.prob < 1) {
			return fmt.Errorf("probability %v out of (0, 1)", m.prob)
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

// mask is how a mark match and the masquerade bit are written.
func mask(m uint32) string { return "0x" + strconv.FormatUint(uint64(m), 16) }

func not(neg bool, a []string) []string {
	if neg {
		return append(a, "!")
	}
	return a
}

// args appends the match's arguments to a.
func (m *match) args(a []string) []string {
	switch m.kind {
	case mSrc:
		return append(not(m.not, a), "-s", m.prefix.String())
	case mDst:
		return append(not(m.not, a), "-d", m.prefix.String())
	case mProto:
		a = append(a, "-p", m.proto)
		if m.port != 0 {
			a = append(a, "-m", m.proto, "--dport", strconv.Itoa(int(m.port)))
		}
		return a
	case mAddrType:
		if m.src {
			return append(a, "-m", "addrtype", "--src-type", "LOCAL")
		}
		return append(a, "-m", "addrtype", "--dst-type", "LOCAL")
	case mCtState:
		return append(not(m.not, append(a, "-m", "conntrack")), "--ctstate", m.name)
	case mCtOrigDst:
		return append(a, "-m", "conntrack", "--ctorigdst", m.addr.String(), "--ctorigdstport", strconv.Itoa(int(m.port)), "--ctproto", m.proto)
	case mMark:
		return append(not(m.not, append(a, "-m", "mark")), "--mark", mask(m.mark)+"/"+mask(m.mark))
	case mStatistic:
		return append(a, "-m", "statistic", "--mode", "random", "--probability", formatProbability(m.prob))
	case mRecentSeen:
		return append(a, "-m", "recent", "--name", m.name, "--rcheck", "--seconds", strconv.FormatInt(m.secs, 10), "--reap")
	case mRecentSet:
		return append(a, "-m", "recent", "--name", m.name, "--set", "--rsource")
	}
	return a
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

func jumpTo(chain string) target          { return target{kind: tJump, chain: chain} }
func dnatTo(to netip.AddrPort) target     { return target{kind: tDNAT, to: to} }
func masquerade(randomFully bool) target  { return target{kind: tMasquerade, randomFully: randomFully} }
func verdict(k targetKind) target         { return target{kind: k} }
func markOr(m uint32) target              { return target{kind: tMarkOr, mark: m} }
func markXor(m uint32) target             { return target{kind: tMarkXor, mark: m} }
func (t *target) name() string            { return t.args(nil)[1] }
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

func (t *target) args(a []string) []string {
	switch t.kind {
	case tJump:
		return append(a, "-j", t.chain)
	case tDNAT:
		return append(a, "-j", "DNAT", "--to-destination", t.to.String())
	case tMarkOr:
		return append(a, "-j", "MARK", "--or-mark", mask(t.mark))
	case tMarkXor:
		return append(a, "-j", "MARK", "--xor-mark", mask(t.mark))
	case tMasquerade:
		if t.randomFully {
			return append(a, "-j", "MASQUERADE", "--random-fully")
		}
		return append(a, "-j", "MASQUERADE")
	case tReturn:
		return append(a, "-j", "RETURN")
	case tAccept:
		return append(a, "-j", "ACCEPT")
	case tDrop:
		return append(a, "-j", "DROP")
	case tReject:
		return append(a, "-j", "REJECT")
	}
	return a
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
	return r.appendArgs(make([]string, 0, 16), false)
}

// appendArgs appends the rule's arguments to a; quote puts the comment in
// double quotes, as iptables-restore reads it.
func (r *rule) appendArgs(a []string, quote bool) []string {
	for i := range r.matches {
		a = r.matches[i].args(a)
	}
	if r.comment != "" {
		c := r.comment
		if quote {
			c = `"` + c + `"`
		}
		a = append(a, "-m", "comment", "--comment", c)
	}
	return r.target.args(a)
}

// text is the rule as iptables-restore reads it after "-A CHAIN ".
func (r *rule) text() string {
	return strings.Join(r.appendArgs(make([]string, 0, 16), true), " ")
}

// jump is a rule in a built-in chain that leads to one of ours (or, for
// the sentinels, any rule that must be present).
type jump struct {
	table, chain string
	rule         rule
}

// target returns the chain the jump leads to (or its verdict).
func (j *jump) to() string { return j.rule.target.name() }
