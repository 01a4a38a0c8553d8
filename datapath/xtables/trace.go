// A packet tracer over the typed rules: the first packet of a connection
// walked through a Fake's tables as the kernel would, so that a test can
// say "from A to ClusterIP:80 lands on X or Y, masqueraded" without root.

package xtables

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Packet is the first packet of a connection.
type Packet struct {
	Src, Dst netip.Addr
	Proto    string // "tcp", "udp" or "sctp"
	Port     uint16 // the destination port
	// InIface is the interface a packet from elsewhere arrives on (-i
	// sees it in PREROUTING, INPUT and FORWARD); a packet the node sends
	// arrives on none.
	InIface string
}

// Verdict is how a packet's way through the rules ends.
type Verdict string

const (
	Accepted Verdict = "ACCEPT" // delivered or forwarded
	Dropped  Verdict = "DROP"
	Rejected Verdict = "REJECT"
)

// Path is one way a packet may take through the rules. Several paths
// come from statistic matches, each branch taken with its probability.
type Path struct {
	Verdict Verdict
	// To is where the packet was DNATed to; invalid when it was not.
	To netip.AddrPort
	// Masquerade says the source was rewritten (MASQUERADE).
	Masquerade bool
	// Local says the packet is delivered to the node itself (filter
	// INPUT), not forwarded.
	Local bool
	// Probability is the chance of this path (the product of the
	// statistic matches taken or not taken on the way).
	Probability float64
	// Chains lists the chains walked, "table/chain", in order.
	Chains []string
}

// Trace walks the first packet of a connection through the Fake's rules
// as the kernel does. A packet from one of the node's addresses (local,
// plus loopback) walks nat OUTPUT, filter OUTPUT, nat POSTROUTING and,
// when its destination is then local, filter INPUT; any other walks nat
// PREROUTING, then filter INPUT if its destination (after DNAT) is local,
// else filter FORWARD and nat POSTROUTING. Built-in chains accept.
//
// The conntrack state is NEW (plus DNAT once DNATed); a recent list has
// seen no one (--rcheck never matches); a statistic match takes both
// branches, each path carrying its probability. ipset matches are refused:
// the Fake does not hold sets.
func (f *Fake) Trace(p Packet, local []netip.Addr) ([]Path, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := tracer{chains: f.chains, local: local}
	st := &flowState{pkt: p, origDst: p.Dst, origPort: p.Port, prob: 1}
	var hooks []Chain
	if t.isLocal(p.Src) {
		st.pkt.InIface = ""
		hooks = []Chain{{NAT, "OUTPUT"}, {Filter, "OUTPUT"}, {NAT, "POSTROUTING"}, {Filter, "INPUT"}}
	} else {
		hooks = []Chain{{NAT, "PREROUTING"}, {Filter, "INPUT"}, {Filter, "FORWARD"}, {NAT, "POSTROUTING"}}
	}
	states := []*flowState{st}
	for _, h := range hooks {
		var next []*flowState
		for _, s := range states {
			if s.verdict != "" || !t.applies(h, s) {
				next = append(next, s)
				continue
			}
			// No hook after routing but INPUT and FORWARD knows where
			// a packet came in.
			t.inIface = ""
			if h.Name == "PREROUTING" || h.Name == "INPUT" || h.Name == "FORWARD" {
				t.inIface = s.pkt.InIface
			}
			flows, err := t.chain(h.Table, h.Name, s, 0)
			if err != nil {
				return nil, err
			}
			for _, fl := range flows {
				next = append(next, fl.st)
			}
		}
		states = next
	}
	paths := make([]Path, len(states))
	for i, s := range states {
		v := s.verdict
		if v == "" {
			v = Accepted
		}
		paths[i] = Path{Verdict: v, Masquerade: s.masq, Local: t.isLocal(s.pkt.Dst), Probability: s.prob, Chains: s.chains}
		if s.dnat {
			paths[i].To = netip.AddrPortFrom(s.pkt.Dst, s.pkt.Port)
		}
	}
	return paths, nil
}

// tracer walks the rules of one Trace.
type tracer struct {
	chains  map[Chain][]Rule
	local   []netip.Addr
	inIface string // the packet's input interface as the current hook sees it
}

// flowState is what the rules can change of a packet on one path.
type flowState struct {
	pkt        Packet
	origDst    netip.Addr // before DNAT, for --ctorigdst
	origPort   uint16
	mark       uint32
	dnat, masq bool
	verdict    Verdict // set by DROP or REJECT: the path ends
	prob       float64
	chains     []string
}

func (s *flowState) clone() *flowState {
	c := *s
	c.chains = slices.Clone(s.chains)
	return &c
}

func (t *tracer) isLocal(a netip.Addr) bool {
	return a.IsLoopback() || slices.Contains(t.local, a.Unmap())
}

// applies says whether hook h sees the packet: filter INPUT only a local
// destination, filter FORWARD and (from outside) nat POSTROUTING only
// one that is not.
func (t *tracer) applies(h Chain, s *flowState) bool {
	fromHere := t.isLocal(s.pkt.Src)
	switch {
	case h.Table == Filter && h.Name == "INPUT":
		return t.isLocal(s.pkt.Dst)
	case h.Table == Filter && h.Name == "FORWARD", h.Table == NAT && h.Name == "POSTROUTING" && !fromHere:
		return !t.isLocal(s.pkt.Dst)
	}
	return true
}

// How a target leaves the chain it is in.
type flowKind uint8

const (
	goOn     flowKind = iota // the next rule
	returned                 // back to the calling chain (RETURN, or the chain's end)
	done                     // no more rules of this table (ACCEPT, DNAT, MASQUERADE, DROP, REJECT)
)

type flow struct {
	st   *flowState
	kind flowKind
}

// maxDepth bounds jumps, against loops (iptables refuses them; a Fake
// loads what it is given).
const maxDepth = 32

// chain walks s through a chain and returns how each path left it:
// returned or done.
func (t *tracer) chain(table, name string, s *flowState, depth int) ([]flow, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("trace: jumps nested deeper than %d at %s/%s", maxDepth, table, name)
	}
	rules, ok := t.chains[Chain{table, name}]
	if !ok {
		return nil, fmt.Errorf("trace: no chain %s/%s", table, name)
	}
	s.chains = append(s.chains, table+"/"+name)
	cur := []*flowState{s}
	var out []flow
	for i := range rules {
		r := &rules[i]
		var next []*flowState
		for _, st := range cur {
			yes, no, err := t.match(r.Matches, st)
			if err != nil {
				return nil, fmt.Errorf("trace: %s/%s rule %d: %w", table, name, i+1, err)
			}
			if no != nil {
				next = append(next, no)
			}
			if yes == nil {
				continue
			}
			flows, err := t.target(table, &r.Target, yes, depth)
			if err != nil {
				return nil, err
			}
			for _, fl := range flows {
				if fl.kind == goOn {
					next = append(next, fl.st)
				} else {
					out = append(out, fl)
				}
			}
		}
		cur = next
	}
	for _, st := range cur {
		out = append(out, flow{st, returned})
	}
	return out, nil
}

// target applies t to s.
func (t *tracer) target(table string, tg *Target, s *flowState, depth int) ([]flow, error) {
	switch tg.kind {
	case tJump:
		sub, err := t.chain(table, tg.chain, s, depth+1)
		if err != nil {
			return nil, err
		}
		for i := range sub {
			if sub[i].kind == returned {
				sub[i].kind = goOn
			}
		}
		return sub, nil
	case tReturn:
		return []flow{{s, returned}}, nil
	case tAccept:
		return []flow{{s, done}}, nil
	case tDrop:
		s.verdict = Dropped
		return []flow{{s, done}}, nil
	case tReject:
		s.verdict = Rejected
		return []flow{{s, done}}, nil
	case tDNAT:
		if table != NAT {
			return nil, fmt.Errorf("trace: DNAT in table %s", table)
		}
		s.pkt.Dst, s.pkt.Port, s.dnat = tg.to.Addr(), tg.to.Port(), true
		return []flow{{s, done}}, nil
	case tMasquerade:
		s.masq = true
		return []flow{{s, done}}, nil
	case tMarkOr:
		s.mark |= tg.mark
		return []flow{{s, goOn}}, nil
	case tMarkXor:
		s.mark ^= tg.mark
		return []flow{{s, goOn}}, nil
	}
	return nil, fmt.Errorf("trace: unknown target %d", tg.kind)
}

// match evaluates ms on s: yes is the path on which the rule matches,
// no the one on which it does not (nil when there is none); a statistic
// match splits s between them by its probability.
func (t *tracer) match(ms []Match, s *flowState) (yes, no *flowState, err error) {
	p := 1.0
	for i := range ms {
		m := &ms[i]
		if m.kind == mStatistic {
			p *= m.prob
			continue
		}
		ok, err := t.test(m, s)
		if err != nil {
			return nil, nil, err
		}
		if !ok {
			return nil, s, nil
		}
	}
	switch {
	case p >= 1:
		return s, nil, nil
	case p <= 0:
		return nil, s, nil
	}
	yes, no = s.clone(), s
	yes.prob *= p
	no.prob *= 1 - p
	return yes, no, nil
}

// test evaluates one match other than statistic.
func (t *tracer) test(m *Match, s *flowState) (bool, error) {
	var ok bool
	switch m.kind {
	case mSrc:
		ok = m.prefix.Contains(s.pkt.Src)
	case mInIface:
		if p, prefix := strings.CutSuffix(m.name, "+"); prefix {
			ok = strings.HasPrefix(t.inIface, p)
		} else {
			ok = t.inIface == m.name
		}
	case mDst:
		ok = m.prefix.Contains(s.pkt.Dst)
	case mProto:
		ok = m.name == s.pkt.Proto && (m.port == 0 || m.port == s.pkt.Port)
	case mAddrType:
		a := s.pkt.Dst
		if m.src {
			a = s.pkt.Src
		}
		ok = t.isLocal(a)
	case mCtState:
		for _, st := range strings.Split(m.name, ",") {
			ok = ok || st == "NEW" || st == "DNAT" && s.dnat
		}
	case mCtOrigDst:
		ok = m.prefix.Addr() == s.origDst && m.port == s.origPort && m.name == s.pkt.Proto
	case mMark:
		ok = s.mark&uint32(m.n) == uint32(m.n)
	case mRecentSeen:
		ok = false // a first packet: no one was seen
	case mRecentSet:
		ok = true
	case mSet:
		return false, fmt.Errorf("set %s: the tracer holds no ipset contents", m.name)
	default:
		return false, fmt.Errorf("unknown match kind %d", m.kind)
	}
	return ok != m.not, nil
}

// Destinations returns the DNAT destinations of paths, sorted, each once
// (paths not DNATed are left out).
func Destinations(paths []Path) []netip.AddrPort {
	var out []netip.AddrPort
	for _, p := range paths {
		if p.To.IsValid() {
			out = append(out, p.To)
		}
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return slices.Compact(out)
}
