package nfgen

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

const (
	groupNFTables = 7 // NFNLGRP_NFTABLES: every committed transaction's objects, then NFT_MSG_NEWGEN

	// watchBuffer is the receive buffer Watch asks for (the kernel doubles
	// it, and never gives less than about 4.5 kB). The events' content is
	// not read, only that some came: a commit larger than the buffer
	// overruns it, the kernel drops the rest and reports ENOBUFS, which is
	// news enough. A small buffer keeps a large commit from filling
	// megabytes of our memory with messages nobody reads.
	watchBuffer = 4096
)

// overruns counts the ENOBUFS every Watch has seen, for the tests.
var overruns atomic.Uint64

// beforeRead, when a test sets it (before Watch starts), runs before each
// wait for events: holding it keeps the socket unread, so a test can make
// an overrun certain instead of a race with the reader.
var beforeRead func()

// Watch reports the nf_tables transactions committed in the calling
// thread's network namespace (any table, any family, by anyone: us
// included) until ctx is done. It subscribes to NFNLGRP_NFTABLES, sends on
// changed once as soon as it is subscribed (commits before that were not
// seen), then once per batch of events that arrives. Sends never block:
// make changed buffered (one slot is enough) and signals coalesce while
// the receiver is busy.
//
// The socket keeps the namespace it was opened in: only the call needs the
// right thread (runtime.LockOSThread, or a goroutine already locked in the
// namespace).
//
// Watch returns nil when ctx is done, and an error when it cannot
// subscribe or the socket fails for good. An overrun of its small receive
// buffer (ENOBUFS: the kernel dropped events) is a signal, not an error.
func Watch(ctx context.Context, changed chan<- struct{}) error {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{Groups: 1 << (groupNFTables - 1)})
	if err != nil {
		return fmt.Errorf("nfgen: subscribe to nf_tables events: %w", err)
	}
	// Closing the socket is what wakes a wait for events, so it belongs to
	// a goroutine that waits for the end of ctx (or of Watch).
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-ctx.Done():
		case <-stop:
		}
		_ = c.Close()
	})
	defer func() {
		close(stop)
		wg.Wait()
	}()
	if err := c.SetReadBuffer(watchBuffer); err != nil {
		return fmt.Errorf("nfgen: nf_tables events: receive buffer: %w", err)
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("nfgen: nf_tables events: %w", err)
	}
	signal := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	signal()

	// drain reads every queued event into a small buffer (read drops the
	// rest of a datagram), with no allocation and nothing parsed, and
	// waits in the runtime's poller while there are none.
	var (
		buf     [64]byte
		got     bool
		readErr error
	)
	drain := func(fd uintptr) bool {
		for {
			_, err := unix.Read(int(fd), buf[:])
			switch {
			case err == nil:
				got = true
			case err == unix.ENOBUFS:
				overruns.Add(1)
				got = true
			case err == unix.EINTR:
			case err == unix.EAGAIN:
				return got // false: wait until readable
			default:
				readErr = err
				return true
			}
		}
	}
	for {
		got, readErr = false, nil
		if beforeRead != nil {
			beforeRead()
		}
		err := rc.Read(drain)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			err = readErr
		}
		if err != nil {
			return fmt.Errorf("nfgen: read nf_tables events: %w", err)
		}
		signal()
	}
}
