package nftables

import (
	"fmt"

	"github.com/google/nftables"
)

// pipe sends the transactions of a cold start or a restart after the
// first, in order, each one queued on one of two netlink connections of
// its own while the one before is in the kernel: the agent's rendering
// and marshalling of a transaction (user time) overlap the kernel's
// commit of the one before (system time, in the sending thread). A
// transaction is sent only once the one before committed; at most two are
// in memory at once (the one in the kernel and the one being queued).
//
// After a failure the transaction queued behind the failed one is never
// sent: google/nftables cannot drop queued messages, so the connections
// are the pipe's own and close with it, their queues with them.
type pipe struct {
	conns  [2]*nftables.Conn
	cur    int        // the connection being queued on
	busy   chan error // the transaction in the kernel; nil when none
	flush  func(*nftables.Conn) error
	txDone func() // after each commit, in the caller's goroutine (tests)
	txs    int    // transactions committed
	err    error  // the first failure; nothing is sent after it
}

func (p *Proxier) newPipe() (*pipe, error) {
	pp := &pipe{flush: p.flushOn, txDone: p.txDone}
	for i := range pp.conns {
		c, err := nftables.New(p.connOpts...)
		if err != nil {
			pp.close()
			return nil, fmt.Errorf("nftables: netlink: %w", err)
		}
		pp.conns[i] = c
	}
	return pp, nil
}

// conn is the connection the next transaction is queued on.
func (pp *pipe) conn() *nftables.Conn { return pp.conns[pp.cur] }

// send hands the transaction queued on conn to the kernel once the one
// before committed, and returns at once; it returns the error of the one
// before, if any (then nothing more is sent).
func (pp *pipe) send() error {
	if err := pp.wait(); err != nil {
		return err
	}
	c, done := pp.conns[pp.cur], make(chan error, 1)
	go func() { done <- pp.flush(c) }()
	pp.busy = done
	pp.cur ^= 1
	return nil
}

// wait returns once the transaction in the kernel, if any, has been
// answered, with its error (or the first error the pipe met).
func (pp *pipe) wait() error {
	if pp.busy != nil {
		err := <-pp.busy
		pp.busy = nil
		if err != nil {
			pp.err = fmt.Errorf("transaction %d: %w", pp.txs+2, err)
		} else {
			pp.txs++
			if pp.txDone != nil {
				pp.txDone()
			}
		}
	}
	return pp.err
}

// close waits for the transaction in the kernel and closes the
// connections, dropping whatever is queued on them.
func (pp *pipe) close() {
	_ = pp.wait()
	for _, c := range pp.conns {
		if c != nil {
			_ = c.CloseLasting()
		}
	}
}
