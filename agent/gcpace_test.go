package agent

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

func TestCollectNow(t *testing.T) {
	const mb = 1 << 20
	// live 25 MB, goal 50 MB: the earliest trigger is at 42.5 MB.
	for _, c := range []struct {
		name                    string
		heap, live, goal, spent uint64
		want                    bool
	}{
		{"far from the trigger", 30 * mb, 25 * mb, 50 * mb, 1 * mb, false},
		{"three syncs from it", 37 * mb, 25 * mb, 50 * mb, 2 * mb, false},
		{"two syncs from it", 39 * mb, 25 * mb, 50 * mb, 2 * mb, true},
		{"past it", 45 * mb, 25 * mb, 50 * mb, 1, true},
		{"nothing allocated", 49 * mb, 25 * mb, 50 * mb, 0, false},
		{"no room above the live heap", 30 * mb, 50 * mb, 50 * mb, 1 * mb, false},
	} {
		if got := collectNow(c.heap, c.live, c.goal, c.spent); got != c.want {
			t.Errorf("%s: collectNow(%d, %d, %d, %d) = %v, want %v", c.name, c.heap, c.live, c.goal, c.spent, got, c.want)
		}
	}
}

// A sync or a write that leaves the heap near the trigger is followed by
// a collection, not one during which a collection started, and one
// collection runs at a time. A write counts the last sync's allocation as
// the next one's, not its own.
func TestBetweenSyncs(t *testing.T) {
	const mb = 1 << 20
	var (
		mu      sync.Mutex
		heap    = heapFigures{allocs: 100 * mb, cycles: 7, heap: 30 * mb, live: 25 * mb, goal: 50 * mb}
		release = make(chan struct{})
		ran     = make(chan struct{}, 4)
	)
	b := &betweenSyncs{
		read:    func() heapFigures { mu.Lock(); defer mu.Unlock(); return heap },
		collect: func() { ran <- struct{}{}; <-release },
	}
	set := func(allocs, cycles, now uint64) {
		mu.Lock()
		heap.allocs, heap.cycles, heap.heap = allocs, cycles, now
		mu.Unlock()
	}

	m := b.mark()
	set(101*mb, 7, 31*mb) // 1 MB spent, 31 + 2 < 42.5
	b.afterSync(m)
	m = b.mark()
	set(102*mb, 8, 44*mb) // past the trigger, but a collection started during the work
	b.afterSync(m)
	select {
	case <-ran:
		t.Fatal("collected after work far from the trigger, or during which a collection started")
	case <-time.After(50 * time.Millisecond): // time for one to start, were it wrongly
	}

	m = b.mark()
	set(103*mb, 8, 41*mb) // 1 MB spent, 41 + 2 ≥ 42.5
	b.afterSync(m)
	waitRan(t, ran, "a collection after a sync near the trigger") // collecting, until released
	m = b.mark()
	set(104*mb, 8, 42*mb)
	b.afterSync(m) // near the trigger too, but one collection runs
	select {
	case <-ran:
		t.Fatal("a second collection started while one ran")
	case <-time.After(50 * time.Millisecond): // time for one to start, were it wrongly
	}
	close(release)
	for b.busy.Load() {
		time.Sleep(time.Millisecond)
	}

	m = b.mark()
	set(134*mb, 8, 35*mb) // a write spent 30 MB; the last sync 1 MB: 35 + 2 < 42.5
	b.afterWrite(m)
	select {
	case <-ran:
		t.Fatal("collected after a write with its own allocation as the next sync's")
	case <-time.After(50 * time.Millisecond):
	}
	m = b.mark()
	set(140*mb, 8, 41*mb) // 41 + 2 ≥ 42.5
	b.afterWrite(m)
	waitRan(t, ran, "a collection after a write near the trigger")

	var nb *betweenSyncs
	nb.afterSync(nb.mark()) // nil: nothing, no panic
	nb.afterWrite(nb.mark())
}

// waitRan waits for a collection to start; a test whose collection never
// starts fails instead of hanging.
func waitRan(t *testing.T, ran <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s", what)
	}
}

// readHeap reads the runtime's own figures: a collection counts, the
// heap after it is live and below its goal, and allocating moves allocs.
func TestReadHeap(t *testing.T) {
	runtime.GC()
	before := readHeap()
	runtime.GC()
	sink = make([]byte, 1<<20)
	h := readHeap()
	if h.cycles <= before.cycles {
		t.Errorf("collections started %d, then %d after runtime.GC", before.cycles, h.cycles)
	}
	if h.allocs < before.allocs+1<<20 {
		t.Errorf("allocated %d, then %d after allocating 1 MiB", before.allocs, h.allocs)
	}
	if h.live == 0 || h.goal <= h.live || h.heap < h.live {
		t.Errorf("heap %d, live %d, goal %d: want 0 < live ≤ heap and live < goal", h.heap, h.live, h.goal)
	}
	// A collection the runtime starts by itself counts too: garbage, at
	// most 1 GiB of it, until one has.
	for i := 0; readHeap().cycles == h.cycles; i++ {
		if i == 1024 {
			t.Fatal("no collection counted after 1 GiB of garbage")
		}
		sink = make([]byte, 1<<20)
	}
}

var sink []byte
