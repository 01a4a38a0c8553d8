package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// Watcher keeps the set of DNAT destinations in the kernel's nat table up
// to date and says when each state was first seen.
//
// With nf_tables it is told: the kernel sends every committed transaction's
// rules, sets and map elements to the event socket, and a transaction is
// stamped with the moment its first message arrived. A full dump is taken only at the start and after the
// event socket overflowed (events of transactions the dump already holds
// are skipped by generation). x_tables tells nothing, so the watcher reads
// the whole table in a loop, pausing as long as a read took (never more than
// half a core), and stamps what it finds with the read's start; Resolution
// reports the cost of one read.
type Watcher struct {
	// Progress, when set, hears of each partial state WaitAll sees.
	Progress func(seen time.Time, found, want int)

	k     Kernel
	have  map[Dest]int // destination -> rules DNATing to it
	costs []time.Duration

	nft     *nftKernel
	view    *nftView // over have
	batches chan batch
	done    chan struct{}
	dumped  bool
	dumpGen uint64
	txn     []nftEvent // events of the transaction in progress
	txnAt   time.Time
	written Written // by the transactions applied so far
}

// Written is what committed nf_tables transactions wrote, as the kernel
// announces them: one message per table, chain, rule, set or list of
// elements added or removed, each echoing the object (so the bytes are
// close to, not equal to, what the proxy sent: a removal echoes the whole
// object, an addition gains its handle).
type Written struct {
	Transactions int
	Messages     int
	Bytes        int // netlink messages, headers included
}

// Sub is what was written between o and w.
func (w Written) Sub(o Written) Written {
	return Written{w.Transactions - o.Transactions, w.Messages - o.Messages, w.Bytes - o.Bytes}
}

type batch struct {
	at  time.Time
	evs []nftEvent
	err error
}

// NewWatcher wraps a kernel reader; Close stops it (before the reader).
func NewWatcher(k Kernel) *Watcher {
	w := &Watcher{k: k, have: map[Dest]int{}, done: make(chan struct{})}
	if n, ok := k.(*nftKernel); ok {
		w.nft = n
		w.view = newNFTView(w.have)
		w.batches = make(chan batch, 1024)
		go w.receive()
	}
	return w
}

func (w *Watcher) receive() {
	for {
		evs, err := w.nft.receive()
		select {
		case w.batches <- batch{at: time.Now(), evs: evs, err: err}:
		case <-w.done:
			return
		}
		if err != nil && !errors.Is(err, unix.ENOBUFS) {
			return
		}
	}
}

// Close stops the event reader.
func (w *Watcher) Close() { close(w.done) }

// Written is what the transactions polled so far wrote (nf_tables only;
// transactions a dump took in are not counted).
func (w *Watcher) Written() Written { return w.written }

// Has reports whether d is in the state last polled.
func (w *Watcher) Has(d Dest) bool { return w.have[d] > 0 }

// Count is how many of want are in the state last polled.
func (w *Watcher) Count(want map[Dest]struct{}) int {
	n := 0
	for d := range want {
		if w.have[d] > 0 {
			n++
		}
	}
	return n
}

// Poll waits for the next kernel state and returns when it was first seen.
func (w *Watcher) Poll(ctx context.Context) (time.Time, error) {
	if w.nft == nil {
		return w.pollTable(ctx)
	}
	if !w.dumped {
		return w.dump(ctx)
	}
	for {
		var b batch
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case b = <-w.batches:
		}
		if b.err != nil {
			if errors.Is(b.err, unix.ENOBUFS) {
				w.dumped, w.txn = false, nil
				return w.dump(ctx)
			}
			return time.Time{}, fmt.Errorf("bench: nf_tables events: %w", b.err)
		}
		var seen time.Time
		for _, e := range b.evs {
			if e.kind != nftMsgNewGen {
				if len(w.txn) == 0 {
					w.txnAt = b.at
				}
				w.txn = append(w.txn, e)
				continue
			}
			if e.gen > w.dumpGen {
				w.written.Transactions++
				for _, ev := range w.txn {
					w.view.apply(ev)
					w.written.Messages++
					w.written.Bytes += ev.size
				}
				seen = w.txnAt
				if seen.IsZero() {
					seen = b.at
				}
			}
			w.txn = w.txn[:0]
		}
		if !seen.IsZero() {
			return seen, nil
		}
	}
}

// dump reads the whole nat table at a generation that did not move while
// it was read.
func (w *Watcher) dump(ctx context.Context) (time.Time, error) {
	for attempt := 0; ; attempt++ {
		// Events queued so far are in what the dump will read.
	drain:
		for {
			select {
			case <-w.batches:
			default:
				break drain
			}
		}
		w.txn = w.txn[:0]
		seen := time.Now()
		g0, err := w.k.Generation()
		if err != nil {
			return seen, err
		}
		start := time.Now()
		if err := w.nft.load(w.view); err != nil {
			return seen, err
		}
		w.costs = append(w.costs, time.Since(start))
		g1, err := w.k.Generation()
		if err != nil {
			return seen, err
		}
		if g0 == g1 || attempt >= 10 {
			w.dumped, w.dumpGen = true, g1
			return seen, ctx.Err()
		}
	}
}

func (w *Watcher) pollTable(ctx context.Context) (time.Time, error) {
	start := time.Now()
	clear(w.have)
	if err := w.k.Scan(func(d Dest) { w.have[d]++ }); err != nil {
		return start, err
	}
	cost := time.Since(start)
	w.costs = append(w.costs, cost)
	select {
	case <-ctx.Done():
		return start, ctx.Err()
	case <-time.After(max(2*time.Millisecond, cost)):
	}
	return start, nil
}

// Resolution is the median cost of one read of the whole table so far
// (for nf_tables, of the dumps; changes arrive as events).
func (w *Watcher) Resolution() time.Duration {
	if len(w.costs) == 0 {
		return 0
	}
	c := slices.Clone(w.costs)
	slices.Sort(c)
	return c[len(c)/2]
}

// WaitAll waits until every destination in want is in the kernel and
// returns when that was first seen, with how many were present at the end.
func (w *Watcher) WaitAll(ctx context.Context, want map[Dest]struct{}, timeout time.Duration, alive func() error) (time.Time, int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	found := 0
	for {
		seen, err := w.PollFor(ctx, 2*time.Second)
		if errors.Is(err, errQuiet) {
			if err := alive(); err != nil {
				return seen, found, err
			}
			continue
		}
		if err != nil {
			return seen, found, fmt.Errorf("bench: %d of %d endpoints programmed: %w", found, len(want), err)
		}
		prev := found
		if found = w.Count(want); found >= len(want) {
			return seen, found, nil
		}
		if found != prev && w.Progress != nil {
			w.Progress(seen, found, len(want))
		}
		if err := alive(); err != nil {
			return seen, found, err
		}
	}
}

// errQuiet: nothing changed within PollFor's wait.
var errQuiet = errors.New("bench: no kernel change")

// PollFor is Poll that gives up with errQuiet after d without a change.
func (w *Watcher) PollFor(ctx context.Context, d time.Duration) (time.Time, error) {
	pctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	seen, err := w.Poll(pctx)
	if err != nil && ctx.Err() == nil && pctx.Err() != nil {
		return seen, errQuiet
	}
	return seen, err
}

// WaitFlip waits until the new endpoint added is in the kernel. That the
// replaced one is gone is not required: kube-proxy leaves the chains of
// removed endpoints in place, unreferenced, until its next cleanup (every
// sync period in large clusters), and both proxies write the new endpoint's
// DNAT in the same iptables-restore transaction that points the service at
// it, so its presence means the change is live.
func (w *Watcher) WaitFlip(ctx context.Context, added Dest, timeout time.Duration) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		seen, err := w.Poll(ctx)
		if err != nil {
			return seen, fmt.Errorf("bench: waiting for %s: %w", added, err)
		}
		if w.Has(added) {
			return seen, nil
		}
	}
}
