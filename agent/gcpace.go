package agent

import (
	"runtime"
	rtmetrics "runtime/metrics"
	"sync/atomic"
)

// betweenSyncs collects garbage between syncs rather than in them.
//
// A collection starts when the heap reaches the runtime's trigger, that
// is while something allocates, and what allocates in a busy agent is a
// sync (and the snapshot write after it). So the collection ran inside
// the sync that crossed the trigger: its marking (tens of milliseconds at
// 10k Services, on the same two cores as the sync) delayed that sync's
// change: in epbench's S2 at 10k Services, the flips that took more than
// twice the median each had a collection start in them (RATIONALE.md,
// "A change's tail").
//
// After a sync or a snapshot write, when the heap is so close to the
// earliest trigger that two more syncs like the last would cross it, the
// agent collects at once, on a goroutine of its own: the next change
// finds the collection done. A collection comes that much earlier than
// the runtime's would have, so a busy agent collects somewhat more often
// (RATIONALE.md has the numbers); a quiet node, which does not sync,
// never does.
type betweenSyncs struct {
	busy  atomic.Bool
	spent atomic.Uint64 // what the last sync allocated
	// collect runs one collection (runtime.GC) and read reads the
	// runtime's heap figures (readHeap); a test's count and pretend.
	collect func()
	read    func() heapFigures
}

func newBetweenSyncs() *betweenSyncs { return &betweenSyncs{collect: runtime.GC, read: readHeap} }

// heapMark is what the runtime had allocated, and how many collections it
// had started, when a piece of work began.
type heapMark struct{ allocs, cycles uint64 }

// heapFigures is what the runtime says of its heap, in bytes, and how
// many collections it has started.
type heapFigures struct {
	allocs uint64 // allocated since the process started
	cycles uint64 // collections started
	heap   uint64 // the heap now, garbage included
	live   uint64 // the heap the last collection kept
	goal   uint64 // where the current cycle ends at the latest
}

// readHeap reads heapFigures from runtime/metrics.
func readHeap() heapFigures {
	var h heapFigures
	fields := []*uint64{&h.allocs, &h.cycles, &h.heap, &h.live, &h.goal}
	s := []rtmetrics.Sample{
		{Name: "/gc/heap/allocs:bytes"},
		{Name: "/gc/cycles/total:gc-cycles"},
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/gc/heap/live:bytes"},
		{Name: "/gc/heap/goal:bytes"},
	}
	rtmetrics.Read(s)
	for i := range s {
		if s[i].Value.Kind() == rtmetrics.KindUint64 {
			*fields[i] = s[i].Value.Uint64()
		}
	}
	return h
}

// mark is taken when a sync or a write begins. A nil betweenSyncs does
// nothing.
func (b *betweenSyncs) mark() heapMark {
	if b == nil {
		return heapMark{}
	}
	h := b.read()
	return heapMark{allocs: h.allocs, cycles: h.cycles}
}

// afterSync is called when a sync that began at m has ended; it starts a
// collection when collectNow says so, with what the sync allocated as
// the next sync's allocation.
func (b *betweenSyncs) afterSync(m heapMark) {
	if b == nil {
		return
	}
	h := b.read()
	spent := h.allocs - m.allocs
	b.spent.Store(spent)
	b.maybe(h, m, spent)
}

// afterWrite is afterSync for a snapshot write, with the last sync's
// allocation as the next sync's: a write's own (every object encoded)
// says nothing of it.
func (b *betweenSyncs) afterWrite(m heapMark) {
	if b == nil {
		return
	}
	b.maybe(b.read(), m, b.spent.Load())
}

// maybe starts a collection, unless one runs, when one started since m
// or collectNow says no for heap figures h.
func (b *betweenSyncs) maybe(h heapFigures, m heapMark, next uint64) {
	if h.cycles != m.cycles {
		return // a collection started during the work: the heap is fresh
	}
	if !collectNow(h.heap, h.live, h.goal, next) {
		return
	}
	if !b.busy.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer b.busy.Store(false)
		b.collect()
	}()
}

// collectNow reports whether a heap of heap bytes (garbage included),
// whose last collection kept live bytes and whose current goal is goal,
// is within two syncs that allocate next bytes each of the earliest point
// at which the runtime may start its next collection: 70% of the way
// from live to goal (the pacer's lower bound on its trigger). Within one
// such sync collected less often (24 collections instead of 27 over the
// same 60 changes at 10k Services, where the runtime alone made 20), but
// a change then still met one now and then (S2 at 5k: p99 2.04× the p50).
func collectNow(heap, live, goal, next uint64) bool {
	if goal <= live || next == 0 {
		return false
	}
	trigger := live + (goal-live)/10*7
	return heap+2*next >= trigger
}
