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
// in any table or family, our own applies too; see nfgen.Watch) until ctx
// is done, then returns nil. The agent's tamper monitor then asks
// Tampered only after a write, instead of every tick: a quiet node does
// not wake for it at all.
//
// With Options.NetNS set it watches that namespace from a thread of its
// own, which it enters and never leaves (the runtime ends a thread that
// is still locked when its goroutine returns); otherwise the calling
// thread's.
func (p *Proxier) WatchWrites(ctx context.Context, written chan<- struct{}) error {
	if p.opts.NetNS == 0 {
		if err := nfgen.Watch(ctx, written); err != nil {
			return fmt.Errorf("nftables: watch writes: %w", err)
		}
		return nil
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread goes with the goroutine
		if err := unix.Setns(p.opts.NetNS, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("nftables: watch writes: enter the network namespace: %w", err)
			return
		}
		if err := nfgen.Watch(ctx, written); err != nil {
			errc <- fmt.Errorf("nftables: watch writes: %w", err)
			return
		}
		errc <- nil
	}()
	return <-errc
}
