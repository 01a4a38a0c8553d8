package nftables

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/edgeproxy/edgeproxy/datapath"
)

// batch collects the operations of one transaction before any of them
// reaches the connection, so that a render refused half-way leaves the
// connection's queue empty (google/nftables has no way to drop queued
// messages but sending them).
type batch struct {
	c   *nftables.Conn
	ops []func()
	// late are the operations that add rules: queued after ops (see
	// run).
	late []func()
	// objs counts the objects the operations put on the kernel's list
	// of the transaction: one each, and a rule's map and each of its
	// elements.
	// What bounds a cold start's or restart's transactions: binding an
	// anonymous map walks that whole list (__nft_set_trans_bind), so a
	// transaction's cost grows with its square.
	objs int
}

func (b *batch) add(op func()) {
	b.ops = append(b.ops, op)
	b.objs++
}

// run queues every operation on the connection and returns how many:
// the rules last. google/nftables asks the kernel to echo each rule
// (NLM_F_ECHO), and the kernel packs the notifications of a transaction
// into shared messages only while they agree on being echoed; rules
// between chains, maps and elements split them into a message each.
func (b *batch) run() int {
	for _, op := range b.ops {
		op()
	}
	for _, op := range b.late {
		op()
	}
	return len(b.ops) + len(b.late)
}

// objects are the nftables values of one family's tables (the main one
// and the service tables), for building messages.
type objects struct {
	tabs []*nftables.Table          // 0 the main table, i shard i-1
	sets []map[string]*nftables.Set // of each table
}

func newObjects(f *fam, k int) *objects {
	o := &objects{}
	for tab := range k + 1 {
		t := &nftables.Table{Family: f.tf, Name: tabName(uint8(tab))}
		sets := map[string]*nftables.Set{}
		for _, s := range f.sets() {
			if tab == 0 && !s.inMain() || tab > 0 && !s.inShard() {
				continue
			}
			set := &nftables.Set{Table: t, Name: s.name, IsMap: s.isMap, Concatenation: len(s.key) > 1, Interval: s.interval}
			set.KeyType = nftables.MustConcatSetType(s.key...)
			if s.isMap {
				set.DataType = nftables.TypeVerdict
			}
			sets[s.name] = set
		}
		o.tabs, o.sets = append(o.tabs, t), append(o.sets, sets)
	}
	return o
}

// addSets queues the fixed sets of every table (adding one that is
// there changes nothing).
func (b *batch) addSets(ob *objects, f *fam) {
	for _, sets := range ob.sets {
		for _, s := range f.sets() {
			if set := sets[s.name]; set != nil {
				b.add(func() { _ = b.c.AddSet(set, nil) })
			}
		}
	}
}

// replaceTable queues on b every table of the family emptied (added, so
// that the delete finds it, deleted, added again) and their fixed sets,
// and returns the objects the rest of the transaction names.
func (t *table) replaceTable(b *batch, k int) *objects {
	ob := newObjects(t.f, k)
	for _, tb := range ob.tabs {
		b.add(func() {
			b.c.AddTable(tb)
			b.c.DelTable(tb)
			b.c.AddTable(tb)
		})
	}
	b.addSets(ob, t.f)
	return ob
}

// affSet is the per-endpoint affinity set name of table tab: client
// addresses, filled by the packet path with timeouts.
func (o *objects) affSet(f *fam, tab uint8, name string) *nftables.Set {
	return &nftables.Set{Table: o.tabs[tab], Name: name, KeyType: f.addrType, Dynamic: true, HasTimeout: true, Size: affinitySetSize}
}

// addAffSets creates the per-endpoint affinity sets names in table tab,
// before the rules that use them.
func (b *batch) addAffSets(o *objects, f *fam, tab uint8, names []string) {
	for _, n := range names {
		set := o.affSet(f, tab, n)
		b.add(func() { _ = b.c.AddSet(set, nil) })
	}
}

// delAffSets deletes the per-endpoint affinity sets names of table tab,
// after the rules that used them.
func (b *batch) delAffSets(o *objects, f *fam, tab uint8, names []string) {
	for _, n := range names {
		set := o.affSet(f, tab, n)
		b.add(func() { b.c.DelSet(set) })
	}
}

func (o *objects) chain(c chainSpec) *nftables.Chain {
	ch := &nftables.Chain{Name: c.name, Table: o.tabs[c.tab]}
	if c.hook != nil {
		prio := c.prio
		ch.Hooknum, ch.Priority, ch.Type = c.hook, &prio, c.typ
		pol := nftables.ChainPolicyAccept
		ch.Policy = &pol
	}
	return ch
}

func (b *batch) addChain(o *objects, c chainSpec) {
	ch := o.chain(c)
	b.add(func() { b.c.AddChain(ch) })
}

// addRules queues c's rules at the end of its chain: the rules among the
// late operations, each anonymous map among the others (see run), in
// this batch both, so that no transaction holds a map without the rule
// that binds it.
func (b *batch) addRules(o *objects, c chainSpec) {
	ch := o.chain(c)
	for _, r := range c.rules {
		var set *nftables.Set
		if r.anon != nil {
			b.ops = append(b.ops, func() { set = addAnon(b.c, ch, r.anon) })
			b.objs += 1 + len(r.anon.elems)
		}
		b.late = append(b.late, func() { addRuleOver(b.c, ch, r, set) })
		b.objs++
	}
}

// addAnon queues m, a rule's anonymous map, in ch's table. The set is new
// for each write (AddSet gives it its transaction ID).
func addAnon(c *nftables.Conn, ch *nftables.Chain, m *anonMap) *nftables.Set {
	set := &nftables.Set{Table: ch.Table, Anonymous: true, Constant: true, IsMap: true, Interval: m.interval,
		KeyType: nftables.TypeInteger, DataType: m.data}
	_ = c.AddSet(set, m.elems) // an error is Flush's
	return set
}

// addRuleOver queues r at the end of ch; its lookup names set, r's
// anonymous map as addAnon queued it (nil when r has none).
func addRuleOver(c *nftables.Conn, ch *nftables.Chain, r rule, set *nftables.Set) {
	ex := r.exprs
	if set != nil {
		ex = slices.Clone(ex)
		ex[r.anon.at] = r.anon.lookup(set)
	}
	c.AddRule(&nftables.Rule{Table: ch.Table, Chain: ch, Exprs: ex})
}

// addRule queues r at the end of ch, and first its anonymous map, if it
// has one.
func addRule(c *nftables.Conn, ch *nftables.Chain, r rule) {
	var set *nftables.Set
	if r.anon != nil {
		set = addAnon(c, ch, r.anon)
	}
	addRuleOver(c, ch, r, set)
}

func (b *batch) flushChain(o *objects, c chainSpec) {
	ch := o.chain(c)
	b.add(func() { b.c.FlushChain(ch) })
}

func (b *batch) delChain(o *objects, c chainSpec) {
	ch := o.chain(c)
	b.add(func() { b.c.DelChain(ch) })
}

// elems adds (del false) or deletes elements, one message list per set.
func (b *batch) elems(o *objects, del bool, es map[elemKey]target) {
	type setRef struct {
		tab  uint8
		name string
	}
	bySet := map[setRef][]nftables.SetElement{}
	for k, t := range es {
		e := nftables.SetElement{Key: []byte(k.key)}
		if k.end != "" {
			e.KeyEnd = []byte(k.end)
		}
		if o.sets[k.tab][k.set].IsMap {
			e.VerdictData = &expr.Verdict{Kind: t.kind, Chain: t.chain}
		}
		r := setRef{k.tab, k.set}
		bySet[r] = append(bySet[r], e)
	}
	refs := make([]setRef, 0, len(bySet))
	for r := range bySet {
		refs = append(refs, r)
	}
	slices.SortFunc(refs, func(a, b setRef) int {
		if a.tab != b.tab {
			return int(a.tab) - int(b.tab)
		}
		return strings.Compare(a.name, b.name)
	})
	for _, r := range refs {
		set, vals := o.sets[r.tab][r.name], bySet[r]
		if del {
			b.add(func() { _ = b.c.SetDeleteElements(set, vals) })
		} else {
			b.add(func() { _ = b.c.SetAddElements(set, vals) })
		}
	}
}

// npKeys are the elements of node-port address a: in @nodeport-ips of
// the main table and of each of the k service tables.
func npKeys(a netip.Addr, k int) []elemKey {
	out := make([]elemKey, 0, k+1)
	for tab := range k + 1 {
		out = append(out, elemKey{tab: uint8(tab), set: setNodePortIPs, key: string(a.AsSlice())})
	}
	return out
}

// rebuild replaces the table with one holding the fixed objects and every
// unit of groups: "add table; delete table; add table" in one
// transaction, so the delete never fails and no packet sees the table
// missing. Its memory grows with the table (a restart uses warmStart);
// it follows a failed apply, or a reload that changes every rule.
//
// other names tables of ours that the layout has not (service tables of
// another number): deleted in the same transaction.
func (t *table) rebuild(b *batch, o *Options, groups map[datapath.ServicePortName][]datapath.Frontend, npIPs []netip.Addr, other []string) (*pending, error) {
	pd := &pending{replace: true, units: make(map[datapath.ServicePortName]*unit, len(groups)), counted: map[shared]int32{}, npIPs: npIPs}
	for s, fs := range groups {
		u, err := buildUnit(t.f, o, fs)
		if err != nil {
			return nil, err
		}
		pd.units[s] = u
		for _, k := range u.counted {
			pd.counted[k]++
		}
	}
	pd.n = len(groups)
	k := o.shardCount()
	for _, n := range other {
		tb := &nftables.Table{Family: t.f.tf, Name: n}
		b.add(func() { b.c.DelTable(tb) })
	}
	ob := t.replaceTable(b, k)
	// Rules look sets up by name, those of this transaction too.
	fixed := t.f.fixedChains(o, npIPs != nil)
	for _, c := range fixed {
		if c.hook == nil {
			b.addChain(ob, c)
		}
	}
	names := make([]datapath.ServicePortName, 0, len(pd.units))
	for s := range pd.units {
		names = append(names, s)
	}
	slices.SortFunc(names, datapath.ServicePortName.Compare)
	all := map[elemKey]target{}
	for _, s := range names {
		b.addAffSets(ob, t.f, pd.units[s].tab, pd.units[s].affSets)
	}
	for _, s := range names {
		u := pd.units[s]
		for _, c := range u.chains {
			b.addChain(ob, c)
			b.addRules(ob, c)
		}
		for k, v := range u.elems {
			all[k] = v
		}
		pd.units[s] = u.summary()
	}
	for k := range pd.counted {
		all[k.elemKey()] = target{}
	}
	for _, a := range npIPs {
		for _, e := range npKeys(a, k) {
			all[e] = target{}
		}
	}
	b.elems(ob, false, all)
	for _, c := range fixed {
		if c.hook != nil {
			b.addChain(ob, c)
		}
		b.addRules(ob, c)
	}
	return pd, nil
}

// update sends the differences of the service ports in scope (plan.Changed,
// or every one with plan.Full) between what was written and groups.
// Within the transaction: elements that go or change are deleted first,
// chains to rewrite flushed, then chains that go deleted (an external
// chain before the service chain it jumps to), new chains created, the
// rules of new and rewritten chains added, and new elements added last:
// nothing ever points at a missing chain. With plan.Full, a service port
// whose frontends are those its unit was built from (inputHash) is not
// built again.
func (t *table) update(b *batch, o *Options, groups map[datapath.ServicePortName][]datapath.Frontend, plan *datapath.Plan, npIPs []netip.Addr) (*pending, error) {
	pd := &pending{units: map[datapath.ServicePortName]*unit{}, counted: map[shared]int32{}, npIPs: npIPs}
	scope := map[datapath.ServicePortName]bool{}
	if plan.Full {
		for s := range t.units {
			scope[s] = true
		}
		for s := range groups {
			scope[s] = true
		}
	} else {
		for s := range plan.Changed {
			scope[s] = true
		}
	}
	k := o.shardCount()
	ob := newObjects(t.f, k)
	del, add := map[elemKey]target{}, map[elemKey]target{}
	var delChains, addChains, rewrite []chainSpec
	type affRef struct {
		tab  uint8
		name string
	}
	var addSets, delSets []affRef
	for s := range scope {
		old := t.units[s]
		if old == nil {
			old = &unit{}
		} else if plan.Full && old.input == inputHash(groups[s]) {
			continue // built from the same frontends: the same unit (inputHash)
		}
		nu, err := buildUnit(t.f, o, groups[s])
		if err != nil {
			return nil, err
		}
		pd.n++
		oldElems := old.elemMap()
		if len(nu.chains) == 0 && len(nu.elems) == 0 {
			if len(old.held) > 0 || len(oldElems) > 0 {
				pd.units[s] = nil
			}
		} else {
			pd.units[s] = nu.summary()
		}
		for k, v := range oldElems {
			if nv, ok := nu.elems[k]; !ok || nv != v {
				del[k] = v
			}
		}
		for k, v := range nu.elems {
			if ov, ok := oldElems[k]; !ok || ov != v {
				add[k] = v
			}
		}
		for _, n := range nu.affSets {
			if !slices.Contains(old.affSets, n) {
				addSets = append(addSets, affRef{nu.tab, n})
			}
		}
		for _, n := range old.affSets {
			if !slices.Contains(nu.affSets, n) {
				delSets = append(delSets, affRef{old.tab, n})
			}
		}
		for i := len(old.held) - 1; i >= 0; i-- {
			if !slices.ContainsFunc(nu.chains, func(c chainSpec) bool { return c.name == old.held[i].name }) {
				delChains = append(delChains, old.held[i].spec())
			}
		}
		for _, c := range nu.chains {
			j := slices.IndexFunc(old.held, func(oc heldChain) bool { return oc.name == c.name })
			switch {
			case j < 0:
				addChains = append(addChains, c)
			case old.held[j].digest != c.digest:
				rewrite = append(rewrite, c)
			}
		}
		for _, k := range old.counted {
			pd.counted[k]--
		}
		for _, k := range nu.counted {
			pd.counted[k]++
		}
	}
	for k, d := range pd.counted {
		was := t.counted[k]
		switch now := was + d; {
		case d == 0:
			delete(pd.counted, k)
		case was == 0 && now > 0:
			add[k.elemKey()] = target{}
		case was > 0 && now <= 0:
			del[k.elemKey()] = target{}
		}
	}
	for _, a := range npIPs {
		if !slices.Contains(t.npIPs, a) {
			for _, e := range npKeys(a, k) {
				add[e] = target{}
			}
		}
	}
	for _, a := range t.npIPs {
		if !slices.Contains(npIPs, a) {
			for _, e := range npKeys(a, k) {
				del[e] = target{}
			}
		}
	}
	// Order matters: a chain can be deleted only once nothing points at
	// it, neither an element nor a rule of a chain being rewritten; a
	// rule can jump only to a chain that exists.
	b.elems(ob, true, del)
	for _, c := range rewrite {
		b.flushChain(ob, c)
	}
	for _, c := range delChains {
		b.delChain(ob, c)
	}
	for _, r := range addSets {
		b.addAffSets(ob, t.f, r.tab, []string{r.name})
	}
	for _, c := range addChains {
		b.addChain(ob, c)
	}
	for _, c := range addChains {
		b.addRules(ob, c)
	}
	for _, c := range rewrite {
		b.addRules(ob, c)
	}
	b.elems(ob, false, add)
	// Per-endpoint affinity sets go once no rule uses them: their
	// chains were rewritten or deleted above.
	for _, r := range delSets {
		b.delAffSets(ob, t.f, r.tab, []string{r.name})
	}
	return pd, nil
}
