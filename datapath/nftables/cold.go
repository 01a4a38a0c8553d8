package nftables

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/edgeproxy/edgeproxy/datapath"
)

// coldBatchMessages bounds the objects (batch.objs: messages, and the
// elements of the Service chains' maps) of each transaction of a cold
// start (coldStart); tests lower it with Proxier.coldBatch. A Service of
// ten endpoints is 14 (its chain, its mark rule, the map rule, its map
// and ten elements), so about 290 Services a transaction, whatever the
// number of Services. Counted as messages, 4,096 held 1,365 such
// Services, and binding each map walked a transaction list five times as
// long: 0.49 s at 5k Services and 1.07 s at 10k (BenchmarkColdStart),
// against 0.37–0.39 s and 0.93–0.96 s now; 2,048 and 8,192 objects did
// no better (0.36–0.40 and 0.41–0.43 s at 5k). What one transaction costs in memory
// is its messages, held three times while it is sent (google/nftables
// keeps each marshalled message, then copies them into one buffer for
// sendmsg, growing it by appends), so a whole 10k-Service table as one
// transaction (48 MB) made a cold start's peak resident set 738 MiB.
// The transactions after the first go through a pipe: the next one is
// rendered while the one before is in the kernel, so two are in memory
// at most. With the pipe, 4,096 beat 8,192 and 1,024 (the agent's cold
// start at 5k Services, median of five: 1.25 s and 130 MiB peak, against
// 1.32 s / 166 MiB and 1.39 s / 118 MiB; 1.58 s / 151 MiB without the
// pipe at 8,192).
const coldBatchMessages = 4096

// restartBatchMessages bounds the objects (as coldBatchMessages) of the
// transactions of a restart, or of a later rewrite of every Service
// (warmStart; tests lower it with Proxier.restartBatch). With a map per
// Service chain, 5k / 10k Services: 0.73 / 2.05 s, against 1.07 / 2.56 s
// for the cascade; one transaction of it all took 3.6 / 14.2 s (a map's
// binding walks the transaction), against 2.1 / 3.3 s. Its transactions cost the
// kernel more than a cold start's: the base chains are there, so each
// one validates every chain they reach. At 10k Services (BenchmarkRestart,
// load average 2) 8,192 took 4.1 s, 3.8 s of it in the kernel, peak
// 198 MiB; 4,096 took 5.0 s (4.5 s), peak 181 MiB.
const restartBatchMessages = 8192

// holds reports whether the kernel has a table of ours in t's family, the
// main one or a service table, and names those of ours that the layout
// has not (service tables of another number: a rebuild deletes them) (a
// dump of table names only).
func (p *Proxier) holds(t *table) (held bool, other []string, err error) {
	ours, err := p.ourTables(t.f)
	if err != nil {
		return false, nil, err
	}
	for _, n := range ours {
		if _, ok := tabIndex(n, p.opts.shardCount()); !ok {
			other = append(other, n)
		}
	}
	return len(ours) > 0, other, nil
}

// coldStart writes a table that holds nothing in use — none in the kernel
// (a boot, a table deleted by hand), or one that only an earlier cold
// start that failed half-way wrote — in transactions of at most
// coldBatchMessages messages, so that the memory a start needs does not
// grow with the number of Services.
//
// The table has no base chain until the last transaction: b (the
// apply's first transaction) replaces the table with one holding the
// sets and the regular fixed chains; the transactions of rest add the
// service ports' chains, rules, elements and per-endpoint affinity sets,
// a bounded batch of service ports each; the last adds the node-port addresses and the base chains. Until then no
// hook leads into the table, so no packet sees part of it (the state
// after each transaction is the table absent, as far as traffic goes),
// and the kernel validates the chains reachable from the hooks once, in
// the last transaction, not in each (it walks them from the base chains
// only). A failure leaves a table without base chains: the next apply
// starts again from b.
//
// rest sends the transactions through a pipe (the next one rendered
// while the one before is in the kernel) and fills pd; it returns how
// many messages it sent.
func (t *table) coldStart(b *batch, o *Options, limit int, groups map[datapath.ServicePortName][]datapath.Frontend, npIPs []netip.Addr) (pd *pending, rest func(pp *pipe) (msgs int, err error)) {
	pd = &pending{replace: true, units: make(map[datapath.ServicePortName]*unit, len(groups)), counted: map[shared]int32{}, npIPs: npIPs, n: len(groups)}
	ob := t.replaceTable(b, o.shardCount())
	fixed := t.f.fixedChains(o, npIPs != nil)
	for _, c := range fixed {
		if c.hook == nil {
			b.addChain(ob, c)
			b.addRules(ob, c)
		}
	}
	rest = func(pp *pipe) (msgs int, err error) {
		names := make([]datapath.ServicePortName, 0, len(groups))
		for s := range groups {
			names = append(names, s)
		}
		slices.SortFunc(names, datapath.ServicePortName.Compare)
		cb := &batch{c: pp.conn()}
		elems := map[elemKey]target{}
		// send ends a transaction: the elements of its service ports
		// after their chains, then into the pipe. A new batch drops
		// the rules the sent one held.
		send := func() error {
			cb.elems(ob, false, elems)
			clear(elems)
			n := cb.run()
			msgs += n
			if n > 0 {
				if err := pp.send(); err != nil {
					return fmt.Errorf("nftables: cold start of the %s table, %w", t.f.name, err)
				}
			}
			cb = &batch{c: pp.conn()}
			return nil
		}
		for _, s := range names {
			u, err := buildUnit(t.f, o, groups[s])
			if err != nil {
				return msgs, err
			}
			cb.addAffSets(ob, t.f, u.tab, u.affSets)
			for _, ch := range u.chains {
				cb.addChain(ob, ch)
				cb.addRules(ob, ch)
			}
			for k, v := range u.elems {
				elems[k] = v
			}
			for _, k := range u.counted {
				if pd.counted[k] == 0 {
					elems[k.elemKey()] = target{}
				}
				pd.counted[k]++
			}
			pd.units[s] = u.summary()
			if cb.objs+len(elems)/64 >= limit {
				if err := send(); err != nil {
					return msgs, err
				}
			}
		}
		for _, a := range npIPs {
			for _, e := range npKeys(a, o.shardCount()) {
				elems[e] = target{}
			}
		}
		for _, ch := range fixed {
			if ch.hook != nil {
				cb.addChain(ob, ch)
				cb.addRules(ob, ch)
			}
		}
		if err := send(); err != nil {
			return msgs, err
		}
		if err := pp.wait(); err != nil {
			return msgs, fmt.Errorf("nftables: cold start of the %s table, %w", t.f.name, err)
		}
		return msgs, nil
	}
	return pd, rest
}
