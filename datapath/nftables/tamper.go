package nftables

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/nfgen"
)

var _ datapath.Monitor = (*Proxier)(nil)

const (
	// maxTouched bounds the transactions that touched our tables kept
	// between two looks of Tampered (ours included: one per apply, a few
	// per second at most); past it the rest count as lost.
	maxTouched = 4096
	// maxOwn bounds the generation ranges of our own applies kept until
	// Tampered has looked past them.
	maxOwn = 256
)

// Tampered reports whether someone else changed our tables since they
// were last verified, and if so marks them to be rewritten by the next
// Apply (with plan.Full, as the agent then sends).
//
// While WatchWrites runs, the answer comes from nf_tables' own events:
// every committed transaction is announced as its objects (each naming
// its table) and then its generation with the socket that sent it. A
// transaction that touched a table of ours (Ours: edgeproxy or a
// service table, ip or ip6), and that was not
// sent from our netlink socket (or, before the socket's port is learned,
// is not one of the generations our applies committed), is tampering: a
// rule added, edited or deleted in one of our chains, an element of our
// sets or maps, a chain's policy, a chain or the table itself. Nothing
// is read from the kernel but the generation. When events were lost
// (the watch's bounded buffer overran), what the transactions in the gap
// touched is unknown: if any of them is not ours, the tables are
// rewritten (counted in MetricTamperUnknown); gaps filled by our own
// applies alone (a table written whole overruns the buffer) cost nothing.
//
// Without a watch (or before our tables were ever known as written at a
// generation), it compares the ruleset generation with the one last
// verified and, after a commit, lists our chain NAMES: then a table gone
// or a chain added or missing is seen, not rules or elements edited.
func (p *Proxier) Tampered(ctx context.Context) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	gen, err := p.conn.GetGen()
	if err != nil {
		return false, fmt.Errorf("nftables: ruleset generation: %w", err)
	}
	ev := p.events.take()
	if !ev.on {
		return p.namesTampered(gen.ID)
	}
	defer p.pruneOwn()
	for _, c := range ev.touched {
		if p.ownGen(c.Gen) {
			p.port, p.portKnown = c.Port, true
		}
	}
	if !p.live() {
		// Nothing of ours to protect; what the events said is moot.
		p.base, p.baseGen = false, ev.last
		return false, nil
	}
	for _, c := range ev.touched {
		if (p.base && !genAfter(c.Gen, p.baseGen)) || p.own(c) {
			continue
		}
		p.log.Warn("edgeproxy's nftables table was changed by someone else; rewriting it at the next sync",
			"generation", c.Gen, "by", c.Name, "pid", c.PID)
		return p.markTampered(), nil
	}
	if !p.base {
		// Our tables were never known as written at a generation (an
		// apply raced with another's commit): today's look, then the
		// events from here on.
		bad, err := p.namesTampered(gen.ID)
		if err == nil && !bad {
			p.base, p.baseGen = true, ev.last
		}
		return bad, err
	}
	if g, ok := p.unseen(ev); ok {
		p.m.tamperUnknown.Inc()
		p.log.Warn("nf_tables events were lost while someone else committed; rewriting edgeproxy's nftables table at the next sync",
			"after", g.from, "upTo", g.to)
		return p.markTampered(), nil
	}
	if genAfter(ev.last, p.baseGen) {
		p.baseGen = ev.last // else our applies are ahead of the events
	}
	p.verified, p.verifiedGen = true, p.baseGen
	return false, nil
}

// namesTampered is the look without events: the chain names of each
// table, when the generation moved since the last verified one.
func (p *Proxier) namesTampered(gen uint32) (bool, error) {
	if p.verified && gen == p.verifiedGen {
		return false, nil
	}
	tampered := false
	for _, t := range p.tables {
		if !t.written || t.needFull {
			continue // rebuilt by the next Apply anyway
		}
		chains, err := p.conn.ListChainsOfTableFamily(t.f.tf)
		if err != nil {
			return false, fmt.Errorf("nftables: list %s chains: %w", t.f.name, err)
		}
		var have []string
		for _, c := range chains {
			if c.Table != nil && Ours(c.Table.Name) {
				have = append(have, c.Table.Name+" "+c.Name)
			}
		}
		slices.Sort(have)
		if !slices.Equal(have, t.chainNames(&p.opts)) {
			t.needFull, tampered = true, true
			p.log.Warn("edgeproxy's nftables table was changed by someone else; rewriting it at the next sync", "family", t.f.name)
		}
	}
	p.verified, p.verifiedGen = !tampered, gen
	return tampered, nil
}

// live reports whether a table is written and owes no rewrite: one that
// tampering would harm.
func (p *Proxier) live() bool {
	for _, t := range p.tables {
		if t.written && !t.needFull {
			return true
		}
	}
	return false
}

// markTampered marks the written tables to be rewritten and returns true.
func (p *Proxier) markTampered() bool {
	for _, t := range p.tables {
		if t.written {
			t.needFull = true
		}
	}
	p.verified, p.base = false, false
	return true
}

// chainNames are the chains the family's tables hold as last written,
// each as "TABLE CHAIN", sorted.
func (t *table) chainNames(o *Options) []string {
	var out []string
	for _, c := range t.f.fixedChains(o, t.npIPs != nil) {
		out = append(out, tabName(c.tab)+" "+c.name)
	}
	for _, u := range t.units {
		for _, c := range u.held {
			out = append(out, tabName(c.tab)+" "+c.name)
		}
	}
	slices.Sort(out)
	return out
}

// own reports whether transaction c is ours: sent from our socket, or,
// before its port is known, one of the generations our applies made.
func (p *Proxier) own(c nfgen.Commit) bool {
	if p.portKnown {
		return c.Port == p.port
	}
	return p.ownGen(c.Gen)
}

// ownGen reports whether generation g is one our applies committed.
func (p *Proxier) ownGen(g uint32) bool {
	for _, r := range p.owns {
		if genAfter(g, r.from) && !genAfter(g, r.to) {
			return true
		}
	}
	return false
}

// ownCovers reports whether every generation in (from, to] is one our
// applies committed.
func (p *Proxier) ownCovers(from, to uint32) bool {
	for genAfter(to, from) {
		i := slices.IndexFunc(p.owns, func(r genRange) bool { return !genAfter(r.from, from) && genAfter(r.to, from) })
		if i < 0 {
			return false
		}
		from = p.owns[i].to
	}
	return true
}

// pruneOwn forgets our generations that Tampered has looked past.
func (p *Proxier) pruneOwn() {
	if !p.base || !p.portKnown {
		return // still needed to learn the port, or to judge a gap
	}
	p.owns = slices.DeleteFunc(p.owns, func(r genRange) bool { return !genAfter(r.to, p.baseGen) })
}

// tamperState is what Tampered knows besides the tables, under p.mu (the
// events under their own lock).
type tamperState struct {
	events commitLog
	// port is our netlink socket's, learned from the events of a
	// generation our applies committed.
	port      uint32
	portKnown bool
	// base: the tables are known as written at baseGen (by our own
	// applies, or by Tampered's look).
	base    bool
	baseGen uint32
	// owns are the generations our applies committed, oldest first.
	owns []genRange
	// eventBuffer replaces the watch's receive buffer size (tests).
	eventBuffer int
}

// genRange is the generations (from, to].
type genRange struct{ from, to uint32 }

// genAfter reports whether generation a comes after b (the counter wraps).
func genAfter(a, b uint32) bool { return int32(a-b) > 0 }

// beforeApply returns the generation before an apply read or rendered
// anything (ok false: unknown). Read first, so that a commit of anyone
// else's while the apply dumps the tables (a restart) or renders them
// moves the generation past what the apply's own transactions account
// for, and afterApply does not take it for ours.
func (p *Proxier) beforeApply() (gen0 uint32, ok bool) {
	gen, err := p.conn.GetGen()
	if err != nil {
		return 0, false
	}
	return gen.ID, true
}

// whole reports whether an apply writes every table whole (pend all
// replace), so that nothing anyone did before it counts.
func whole(pend []*pending) bool {
	for _, pd := range pend {
		if !pd.replace {
			return false
		}
	}
	return len(pend) > 0
}

// afterApply records the generations of an apply that started at gen0
// and committed txs transactions, when the generation moved by exactly
// that (no one else committed in between): they are ours, and the tables
// are known as written at the new generation if they were at gen0 or the
// apply wrote them whole. The tables are verified at the new generation
// then too, when Tampered had verified them at gen0 or the apply wrote
// them whole (nothing anyone did before it is left in them): Tampered,
// asked after the commits the watch announced, need not look again (at
// 10k Services, a dump of 10k chain names after each of our own applies
// without a watch), and a cold start's apply vouches for its tables at
// once, so that the loop can rest after it rather than wake one
// sync.period later to compare (Unchanged). Anything else is left to
// Tampered.
func (p *Proxier) afterApply(gen0 uint32, ok, whole bool, txs int) {
	if !ok || txs == 0 {
		return
	}
	gen, err := p.conn.GetGen()
	if err != nil || gen.ID != gen0+uint32(txs) {
		return
	}
	if len(p.owns) == maxOwn {
		p.owns = slices.Delete(p.owns, 0, 1)
	}
	p.owns = append(p.owns, genRange{gen0, gen.ID})
	if whole || (p.base && p.baseGen == gen0) {
		p.base, p.baseGen = true, gen.ID
	}
	if whole || (p.verified && p.verifiedGen == gen0) {
		p.verified, p.verifiedGen = true, gen.ID
	}
}

// commitLog is what the watch of nf_tables events (WatchWrites) learned,
// for Tampered. It has a lock of its own: the watch never waits for an
// apply.
type commitLog struct {
	mu      sync.Mutex
	on      bool // a watch reads events
	started bool // its start was seen: last is set
	last    uint32
	// gaps are the generations whose events were lost since the last
	// look (bounded: past maxGaps they merge into one); open: the
	// watch's start, all generations up to gaps[0].to are unknown.
	gaps    []genRange
	open    bool
	touched []nfgen.Commit // since the last look, oldest first
}

// maxGaps bounds commitLog.gaps.
const maxGaps = 64

// events is a snapshot of the log, taken by Tampered.
type events struct {
	on, open bool
	last     uint32
	gaps     []genRange
	touched  []nfgen.Commit
}

func (l *commitLog) start() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.on, l.started, l.gaps, l.open, l.touched = true, false, nil, false, nil
}

func (l *commitLog) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.on = false
}

// seen records one transaction the watch read, and reports whether it
// was a loss (not the watch's start).
func (l *commitLog) seen(c nfgen.Commit) (lost bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lost = l.started && c.Lost
	switch {
	case !l.started:
		l.gaps, l.open = append(l.gaps, genRange{c.Gen, c.Gen}), true
	case c.Lost || c.Gen != l.last+1 || (c.Touched && len(l.touched) == maxTouched):
		if len(l.gaps) == maxGaps {
			l.gaps = []genRange{{l.gaps[0].from, l.gaps[len(l.gaps)-1].to}}
		}
		g := genRange{l.last, c.Gen}
		if !c.Lost && !(c.Touched && len(l.touched) == maxTouched) {
			g.to = c.Gen - 1 // only the missing ones
			if c.Touched {
				l.touched = append(l.touched, c)
			}
		}
		l.gaps = append(l.gaps, g)
	case c.Touched:
		l.touched = append(l.touched, c)
	}
	l.started, l.last = true, c.Gen
	return lost
}

// take returns what the watch learned since the last take.
func (l *commitLog) take() events {
	l.mu.Lock()
	defer l.mu.Unlock()
	ev := events{on: l.on && l.started, open: l.open, last: l.last, gaps: l.gaps, touched: l.touched}
	l.touched, l.gaps, l.open = nil, nil, false
	return ev
}

// unseen returns a gap of ev, after base, that our own applies do not
// fill, if any.
func (p *Proxier) unseen(ev events) (genRange, bool) {
	for i, g := range ev.gaps {
		if i == 0 && ev.open || genAfter(p.baseGen, g.from) {
			g.from = p.baseGen
		}
		if genAfter(g.to, g.from) && !p.ownCovers(g.from, g.to) {
			return g, true
		}
	}
	return genRange{}, false
}

// touches: an object of a table of ours (Ours), ip or ip6.
func touches(family uint8, name []byte) bool {
	return (family == unix.NFPROTO_IPV4 || family == unix.NFPROTO_IPV6) && Ours(string(name))
}
