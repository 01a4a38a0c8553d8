package nftables

import (
	"context"
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/nfgen"
)

var _ datapath.Watcher = (*Proxier)(nil)

// WatchWrites implements datapath.Watcher: it signals on written after
// every nf_tables commit in the namespace the Proxier programs (anyone's,
// in any table or family, our own applies too; see nfgen.WatchCommits)
// until ctx is done, then returns nil. The agent's tamper monitor then
// asks Tampered only after a write, instead of every tick: a quiet node
// does not wake for it at all. While it runs, it also reads which
// transactions touched our tables and who sent them, which is what
// Tampered then judges by (see there).
//
// With Options.NetNS set it watches that namespace from a thread of its
// own, which it enters and never leaves (the runtime ends a thread that
// is still locked when its goroutine returns); otherwise the calling
// thread's.
func (p *Proxier) WatchWrites(ctx context.Context, written chan<- struct{}) error {
	if p.opts.NetNS == 0 {
		return p.watch(ctx, written)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread goes with the goroutine
		if err := unix.Setns(p.opts.NetNS, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("nftables: watch writes: enter the network namespace: %w", err)
			return
		}
		errc <- p.watch(ctx, written)
	}()
	return <-errc
}

// watch reads the events in the calling thread's namespace into
// p.events while it runs.
func (p *Proxier) watch(ctx context.Context, written chan<- struct{}) error {
	p.events.start()
	defer p.events.stop()
	seen := func(c nfgen.Commit) {
		if p.events.seen(c) {
			p.m.eventLosses.Inc()
		}
	}
	if err := nfgen.WatchCommits(ctx, written, nfgen.Commits{Touches: touches, Seen: seen, Buffer: p.eventBuffer}); err != nil {
		return fmt.Errorf("nftables: watch writes: %w", err)
	}
	return nil
}
