package nftables

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/edgeproxy/edgeproxy/datapath"
)

// present is what the kernel holds of one family's table, as a restart
// finds it: the names of its chains and sets (a dump of names only, no
// rule), and the elements of the fixed maps and sets (keys and the
// chains they point at).
type present struct {
	chains map[objRef]bool
	sets   map[objRef]bool
	elems  map[elemKey]target
	// tables: the tables of ours, each written once at least (a table
	// without any, a cold start's first transaction).
	tables map[uint8]bool
	// other: tables of ours that the layout has no more (another
	// number of service tables): deleted at the end of the restart.
	other []string
}

// objRef is a chain or set of one of a family's tables.
type objRef struct {
	tab  uint8
	name string
}

// tabIndex is the table number (tabName) of the table named name, if the
// layout of k service tables has it.
func tabIndex(name string, k int) (uint8, bool) {
	for tab := range k + 1 {
		if tabName(uint8(tab)) == name {
			return uint8(tab), true
		}
	}
	return 0, false
}

// dump reads what the kernel holds of t's tables (see present).
func (p *Proxier) dump(t *table, k int) (*present, error) {
	pr := &present{chains: map[objRef]bool{}, sets: map[objRef]bool{}, elems: map[elemKey]target{}, tables: map[uint8]bool{}}
	ours, err := p.ourTables(t.f)
	if err != nil {
		return nil, err
	}
	for _, n := range ours {
		if tab, ok := tabIndex(n, k); ok {
			pr.tables[tab] = true
		} else {
			pr.other = append(pr.other, n)
		}
	}
	chains, err := p.conn.ListChainsOfTableFamily(t.f.tf)
	if err != nil {
		return nil, fmt.Errorf("nftables: list %s chains: %w", t.f.name, err)
	}
	for _, c := range chains {
		if c.Table == nil {
			continue
		}
		if tab, ok := tabIndex(c.Table.Name, k); ok {
			pr.chains[objRef{tab, c.Name}] = true
		}
	}
	ob := newObjects(t.f, k)
	for tab, tb := range ob.tabs {
		if !pr.tables[uint8(tab)] {
			continue
		}
		sets, err := p.conn.GetSets(tb)
		if err != nil {
			return nil, fmt.Errorf("nftables: list %s %s sets: %w", t.f.name, tb.Name, err)
		}
		for _, s := range sets {
			if s.Anonymous {
				continue // a rule's own map: it goes with its rule
			}
			pr.sets[objRef{uint8(tab), s.Name}] = true
		}
		for _, s := range t.f.sets() {
			set := ob.sets[tab][s.name]
			if set == nil || !pr.sets[objRef{uint8(tab), s.name}] {
				continue
			}
			es, err := p.conn.GetSetElements(set)
			if err != nil {
				return nil, fmt.Errorf("nftables: list the elements of %s %s %s: %w", t.f.name, tb.Name, s.name, err)
			}
			for _, e := range es {
				if e.IntervalEnd {
					continue
				}
				k := elemKey{tab: uint8(tab), set: s.name, key: string(e.Key), end: string(e.KeyEnd)}
				var v target
				if s.isMap {
					v = verdictOf(e.Val)
				}
				pr.elems[k] = v
			}
		}
	}
	return pr, nil
}

func (r objRef) compare(o objRef) int {
	if r.tab != o.tab {
		return int(r.tab) - int(o.tab)
	}
	return strings.Compare(r.name, o.name)
}

// verdictOf decodes an element's verdict data (NFTA_DATA_VERDICT's
// attributes: its code and chain), which google/nftables leaves as bytes.
func verdictOf(b []byte) target {
	var v target
	for len(b) >= 4 {
		n := int(binary.NativeEndian.Uint16(b))
		typ := binary.NativeEndian.Uint16(b[2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if n < 4 || n > len(b) {
			break
		}
		data := b[4:n]
		switch typ {
		case unix.NFTA_VERDICT_CODE:
			if len(data) == 4 {
				v.kind = expr.VerdictKind(int32(binary.BigEndian.Uint32(data)))
			}
		case unix.NFTA_VERDICT_CHAIN:
			v.chain = string(data[:max(0, len(data)-1)]) // NUL-terminated
		}
		b = b[min(len(b), (n+3)&^3):]
	}
	return v
}

// owner is the frontend an element of a fixed map or set belongs to:
// its key in the address-keyed sets ("a" and the key; a firewall-allow
// element by its key's frontend part) and in the node-port ones ("p" and
// the key). The shared sets (hairpin, cluster IPs, node-port addresses)
// belong to none.
func owner(k elemKey) (string, bool) {
	switch k.set {
	case mapServiceIPs, mapNoEndpoints, setFirewallIPs:
		return "a" + k.key, true
	case setFirewallAllow:
		// address . proto . port, then the source address.
		n := (len(k.key) - 8) / 2
		return "a" + k.key[:n+8], true
	case mapNodePorts, mapNoEPPorts:
		return "p" + k.key, true
	}
	return "", false
}

// warmStart rewrites a table that serves traffic — a restart of the
// agent finds it in the kernel — in transactions of at most limit
// messages, so that the memory a restart needs does not grow with the
// number of Services, while every Service keeps being answered by its
// rules as they were until its new ones are in. pr is what the kernel
// holds (dump).
//
// b (the apply's first transaction) makes sure the table, its fixed sets
// and its fixed regular chains exist (adding what is there changes
// nothing). Then each transaction of rest rewrites a group of whole
// service ports: their chains (flushed and written again, or added),
// their affinity sets, and every element of the frontends they own, old
// ones of those frontends deleted and new ones added in the same
// transaction, so that a frontend is never seen half old and half new.
// The fixed chains are rewritten next, each in one transaction; then
// what no service port owns any more goes, each step in bounded
// transactions: elements, then the rules of the stale chains (so that
// none jumps to another), then those chains and stale affinity sets,
// once nothing points at them.
//
// A failure leaves a table that answers every Service, some as before
// and some as planned (the transactions sent are whole): the next apply
// replaces the table in one transaction (rebuild).
func (t *table) warmStart(b *batch, o *Options, limit int, groups map[datapath.ServicePortName][]datapath.Frontend, npIPs []netip.Addr, pr *present) (pd *pending, rest func(pp *pipe) (msgs int, err error)) {
	pd = &pending{replace: true, units: make(map[datapath.ServicePortName]*unit, len(groups)), counted: map[shared]int32{}, npIPs: npIPs, n: len(groups)}
	k := o.shardCount()
	ob := newObjects(t.f, k)
	for _, tb := range ob.tabs {
		b.add(func() { b.c.AddTable(tb) })
	}
	b.addSets(ob, t.f)
	fixed := t.f.fixedChains(o, npIPs != nil)
	for _, c := range fixed {
		if c.hook == nil && !pr.chains[objRef{c.tab, c.name}] {
			b.addChain(ob, c)
			b.addRules(ob, c)
			pr.chains[objRef{c.tab, c.name}] = true // and written again below
		}
	}
	rest = func(pp *pipe) (msgs int, err error) {
		// byOwner: the kernel's elements of each frontend.
		byOwner := map[string][]elemKey{}
		for k := range pr.elems {
			if f, ok := owner(k); ok {
				byOwner[f] = append(byOwner[f], k)
			}
		}
		names := make([]datapath.ServicePortName, 0, len(groups))
		for s := range groups {
			names = append(names, s)
		}
		slices.SortFunc(names, datapath.ServicePortName.Compare)
		cb := &batch{c: pp.conn()}
		del, add := map[elemKey]target{}, map[elemKey]target{}
		// send ends a transaction: elements deleted, the chains' operations
		// queued so far, elements added; then into the pipe.
		send := func() error {
			tx := &batch{c: cb.c}
			tx.elems(ob, true, del)
			tx.ops = append(tx.ops, cb.ops...)
			tx.late = append(tx.late, cb.late...)
			tx.elems(ob, false, add)
			clear(del)
			clear(add)
			n := tx.run()
			msgs += n
			if n > 0 {
				if err := pp.send(); err != nil {
					return fmt.Errorf("nftables: restart of the %s table, %w", t.f.name, err)
				}
			}
			cb = &batch{c: pp.conn()}
			return nil
		}
		full := func() bool { return cb.objs+(len(del)+len(add))/64 >= limit }
		// set makes the kernel's element k hold v, in the transaction
		// being built.
		set := func(k elemKey, v target) {
			if ov, ok := pr.elems[k]; ok {
				if ov == v {
					return
				}
				del[k] = ov
			}
			add[k] = v
			pr.elems[k] = v
		}
		wantChains, wantSets := map[objRef]bool{}, map[objRef]bool{}
		for _, s := range names {
			u, err := buildUnit(t.f, o, groups[s])
			if err != nil {
				return msgs, err
			}
			for _, n := range u.affSets {
				r := objRef{u.tab, n}
				wantSets[r] = true
				if !pr.sets[r] {
					cb.addAffSets(ob, t.f, u.tab, []string{n})
					pr.sets[r] = true
				}
			}
			for _, ch := range u.chains {
				r := objRef{ch.tab, ch.name}
				wantChains[r] = true
				if pr.chains[r] {
					cb.flushChain(ob, ch)
				} else {
					cb.addChain(ob, ch)
					pr.chains[r] = true
				}
				cb.addRules(ob, ch)
			}
			// The frontends the unit owns lose their other elements.
			for k := range u.elems {
				f, _ := owner(k)
				for _, ok := range byOwner[f] {
					if _, keep := u.elems[ok]; !keep {
						if ov, in := pr.elems[ok]; in {
							del[ok] = ov
							delete(pr.elems, ok)
						}
					}
				}
				delete(byOwner, f)
			}
			for k, v := range u.elems {
				set(k, v)
			}
			for _, k := range u.counted {
				if pd.counted[k] == 0 {
					set(k.elemKey(), target{})
				}
				pd.counted[k]++
			}
			pd.units[s] = u.summary()
			if full() {
				if err := send(); err != nil {
					return msgs, err
				}
			}
		}
		for _, a := range npIPs {
			for _, e := range npKeys(a, k) {
				set(e, target{})
			}
		}
		if err := send(); err != nil {
			return msgs, err
		}
		// The fixed chains, as planned: each flushed and written again
		// (or added) in one transaction; a base chain added again too,
		// which sets its policy back to accept.
		for _, ch := range fixed {
			wantChains[objRef{ch.tab, ch.name}] = true
			if pr.chains[objRef{ch.tab, ch.name}] {
				if ch.hook != nil {
					cb.addChain(ob, ch)
				}
				cb.flushChain(ob, ch)
			} else {
				cb.addChain(ob, ch)
			}
			cb.addRules(ob, ch)
		}
		if err := send(); err != nil {
			return msgs, err
		}
		// What nothing planned holds: elements first.
		keep := map[elemKey]bool{}
		for _, u := range pd.units {
			for _, e := range u.list {
				keep[e.k] = true
			}
		}
		for k := range pd.counted {
			keep[k.elemKey()] = true
		}
		for _, a := range npIPs {
			for _, e := range npKeys(a, k) {
				keep[e] = true
			}
		}
		for k, v := range pr.elems {
			if !keep[k] {
				del[k] = v
				if full() {
					if err := send(); err != nil {
						return msgs, err
					}
				}
			}
		}
		if err := send(); err != nil {
			return msgs, err
		}
		// Stale chains: emptied first, so that none jumps to another,
		// then deleted with the stale affinity sets their rules used.
		var stale []objRef
		for r := range pr.chains {
			if !wantChains[r] {
				stale = append(stale, r)
			}
		}
		slices.SortFunc(stale, objRef.compare)
		for _, r := range stale {
			cb.flushChain(ob, chainSpec{tab: r.tab, name: r.name})
			if full() {
				if err := send(); err != nil {
					return msgs, err
				}
			}
		}
		if err := send(); err != nil {
			return msgs, err
		}
		for _, r := range stale {
			cb.delChain(ob, chainSpec{tab: r.tab, name: r.name})
			if full() {
				if err := send(); err != nil {
					return msgs, err
				}
			}
		}
		var staleSets []objRef
		for r := range pr.sets {
			if ob.sets[r.tab][r.name] == nil && !wantSets[r] {
				staleSets = append(staleSets, r)
			}
		}
		slices.SortFunc(staleSets, objRef.compare)
		for _, r := range staleSets {
			cb.delAffSets(ob, t.f, r.tab, []string{r.name})
			if full() {
				if err := send(); err != nil {
					return msgs, err
				}
			}
		}
		// Tables of ours the layout has no more: once ours are whole,
		// their dispatch goes.
		for _, n := range pr.other {
			tb := &nftables.Table{Family: t.f.tf, Name: n}
			cb.add(func() { cb.c.DelTable(tb) })
		}
		if err := send(); err != nil {
			return msgs, err
		}
		if err := pp.wait(); err != nil {
			return msgs, fmt.Errorf("nftables: restart of the %s table, %w", t.f.name, err)
		}
		return msgs, nil
	}
	return pd, rest
}
