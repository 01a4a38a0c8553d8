package nfgen

import (
	"bytes"
	"context"
	"encoding/binary"
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

	// commitBuffer is the receive buffer WatchCommits asks for (forced
	// past net.core.rmem_max when the process may; the kernel doubles
	// it): 256 KiB. The events are read as they come, so the buffer only
	// bridges the time the reader waits to be scheduled. It holds the
	// events of a one-Service change (about 10 kB, mostly the Service
	// chain's rules echoed) and of any hand edit many times over, so that
	// such commits are always read whole; a commit of megabytes (a table
	// written whole at thousands of Services) overruns it, which the
	// reader is told (Commit.Lost). Bigger would only move the size at
	// which that happens, at the cost of that much memory per node when
	// the reader lags.
	commitBuffer = 256 << 10
	// readBuffer holds one datagram: the kernel packs the events of a
	// commit into datagrams of at most a page or two (NLMSG_GOODSIZE); a
	// single larger message is reported as lost (MSG_TRUNC).
	readBuffer = 64 << 10
)

// nf_tables message types and attributes the commit reader needs.
const (
	msgNewGen      = 15 // NFT_MSG_NEWGEN
	attrGenPID     = 2  // NFTA_GEN_PROC_PID
	attrGenName    = 3  // NFTA_GEN_PROC_NAME
	attrObjTable   = 1  // NFTA_{TABLE_NAME,CHAIN_TABLE,RULE_TABLE,SET_TABLE,SET_ELEM_LIST_TABLE,OBJ_TABLE,FLOWTABLE_TABLE}
	nfgenmsgLength = 4
)

// overruns counts the ENOBUFS every watch has seen.
var overruns atomic.Uint64

// Overruns is how many times a watch (Watch or WatchCommits) found its
// receive buffer overrun (ENOBUFS) since the process started.
func Overruns() uint64 { return overruns.Load() }

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
	return watch(ctx, changed, nil)
}

// Commit is one committed nf_tables transaction, as its events announced
// it: the objects it added or deleted, then its generation message.
type Commit struct {
	Gen uint32 // its ruleset generation (NFTA_GEN_ID)
	// Port is the netlink port of the socket that sent the transaction
	// (the events' nlmsg_pid): a process that knows its socket's port
	// tells its own transactions by it, whatever thread sent them and
	// whatever PID namespace it runs in.
	Port uint32
	// PID and Name are the committing task as the kernel names it
	// (NFTA_GEN_PROC_PID: the thread's id in the initial PID namespace;
	// NFTA_GEN_PROC_NAME: its comm), for messages.
	PID  uint32
	Name string
	// Touched: one of its objects is in a table Commits.Touches matched.
	Touched bool
	// Lost: events were dropped (the receive buffer overran, or a
	// message did not fit a read): the transactions after the last one
	// reported, up to Gen, may have touched anything, and are not
	// reported on their own. Only Gen is set. The first Commit reported
	// is of this kind: Gen is the generation current when the watch
	// subscribed, and what came before it is unknown.
	Lost bool
}

// Commits says what WatchCommits reports.
type Commits struct {
	// Touches tells whether an object of table name in family (an
	// NFPROTO_* value: the nfgenmsg's) is one the watcher cares about.
	// name is only valid during the call.
	Touches func(family uint8, name []byte) bool
	// Seen is called, on the watch's goroutine, for each transaction's
	// generation message, before the signal on changed.
	Seen func(Commit)
	// Buffer is the receive buffer to ask for; 0 is commitBuffer.
	Buffer int
}

// WatchCommits is Watch that also reads the events: it reports each
// committed transaction to cs.Seen, with whether it touched a table
// cs.Touches cares about and who committed it. Its receive buffer is
// bounded (commitBuffer); an overrun is reported as a Commit with Lost
// set, and counted.
func WatchCommits(ctx context.Context, changed chan<- struct{}, cs Commits) error {
	return watch(ctx, changed, &cs)
}

func watch(ctx context.Context, changed chan<- struct{}, cs *Commits) error {
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
	rc, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("nfgen: nf_tables events: %w", err)
	}
	var r *reader
	if cs == nil {
		if err := c.SetReadBuffer(watchBuffer); err != nil {
			return fmt.Errorf("nfgen: nf_tables events: receive buffer: %w", err)
		}
	} else {
		size := cs.Buffer
		if size <= 0 {
			size = commitBuffer
		}
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, size)
			if serr != nil {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, size)
			}
		}); err != nil || serr != nil {
			return fmt.Errorf("nfgen: nf_tables events: receive buffer: %w", firstErr(err, serr))
		}
		// Subscribed first, then the generation: every commit after it
		// is announced to this socket whole.
		gen, err := Current()
		if err != nil {
			return fmt.Errorf("nfgen: nf_tables events: %w", err)
		}
		r = &reader{cs: cs, buf: make([]byte, readBuffer)}
		r.report(gen)
	}
	signal := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	signal()

	// drain reads every queued event: into a small buffer that drops the
	// rest of each datagram, with no allocation and nothing parsed, when
	// only the signal is wanted; whole, to r, otherwise. It waits in the
	// runtime's poller while there are none.
	var (
		buf     [64]byte
		got     bool
		readErr error
	)
	drain := func(fd uintptr) bool {
		for {
			var err error
			if r == nil {
				_, err = unix.Read(int(fd), buf[:])
			} else {
				var n, flags int
				n, _, flags, _, err = unix.Recvmsg(int(fd), r.buf, nil, 0)
				if err == nil {
					r.datagram(r.buf[:n], flags&unix.MSG_TRUNC != 0)
				}
			}
			switch {
			case err == nil:
				got = true
			case err == unix.ENOBUFS:
				overruns.Add(1)
				if r != nil {
					r.overrun()
				}
				got = true
			case err == unix.EINTR:
			case err == unix.EAGAIN:
				if r != nil {
					if err := r.drained(Current); err != nil {
						readErr = err
						return true
					}
				}
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

func firstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// reader follows the transactions in the events.
//
// When the receive buffer overruns, the kernel drops events and reports
// ENOBUFS once, at the next read, ahead of the events still queued; it
// reports the next drop only after the queue was empty again. So once the
// queue is seen empty (EAGAIN) after an ENOBUFS, the reader asks the
// generation and reports every transaction up to it as lost; the events
// of those that still arrive are skipped (each event names its
// transaction's generation, modulo 2^16, in its nfgenmsg's res_id), and
// the events of later ones come whole, or a new ENOBUFS says otherwise.
type reader struct {
	cs  *Commits
	buf []byte
	cur Commit // the transaction whose events are being read
	// lost: events were dropped since the last report; skip: the events
	// of generations up to skipGen were reported lost.
	lost    bool
	skip    bool
	skipGen uint32
}

func (r *reader) overrun() { r.lost = true }

// drained is called when the queue was found empty: a loss is reported
// then, up to the current generation (current asks it).
func (r *reader) drained(current func() (uint32, error)) error {
	if !r.lost {
		return nil
	}
	gen, err := current()
	if err != nil {
		return err
	}
	r.lost, r.cur = false, Commit{}
	r.report(gen)
	return nil
}

// report says that generations up to gen may have been lost.
func (r *reader) report(gen uint32) {
	r.skip, r.skipGen = true, gen
	r.cs.Seen(Commit{Gen: gen, Lost: true})
}

// datagram reads the netlink messages of one datagram; trunc: the kernel
// cut it to fit the buffer.
func (r *reader) datagram(b []byte, trunc bool) {
	if trunc {
		r.lost = true
	}
	for len(b) >= unix.NLMSG_HDRLEN {
		n := int(binary.NativeEndian.Uint32(b[0:4]))
		if n < unix.NLMSG_HDRLEN || n > len(b) {
			r.lost = true
			return
		}
		typ := binary.NativeEndian.Uint16(b[4:6])
		port := binary.NativeEndian.Uint32(b[12:16])
		if typ>>8 == subsysNFTables {
			r.message(uint8(typ), port, b[unix.NLMSG_HDRLEN:n])
		}
		b = b[min(len(b), nlmsgAlign(n)):]
	}
}

func nlmsgAlign(n int) int { return (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }

func (r *reader) message(typ uint8, port uint32, data []byte) {
	if len(data) < nfgenmsgLength {
		r.lost = true
		return
	}
	family, attrs := data[0], data[nfgenmsgLength:]
	if r.skip {
		// res_id: the generation of the event's transaction, its low 16 bits.
		if int16(binary.BigEndian.Uint16(data[2:4])-uint16(r.skipGen)) <= 0 {
			return // of a transaction already reported lost
		}
		r.skip = false
	}
	if typ != msgNewGen {
		if !r.cur.Touched && r.cs.Touches != nil {
			if name, ok := attr(attrs, attrObjTable); ok && r.cs.Touches(family, bytes.TrimRight(name, "\x00")) {
				r.cur.Touched = true
			}
		}
		return
	}
	c := r.cur
	r.cur = Commit{}
	c.Port = port
	v, ok := attr(attrs, attrGenID)
	if !ok || len(v) != 4 {
		r.lost = true
		return
	}
	c.Gen = binary.BigEndian.Uint32(v)
	if v, ok := attr(attrs, attrGenPID); ok && len(v) == 4 {
		c.PID = binary.BigEndian.Uint32(v)
	}
	if v, ok := attr(attrs, attrGenName); ok {
		c.Name = string(bytes.TrimRight(v, "\x00"))
	}
	r.cs.Seen(c)
}

// attr returns the payload of the first attribute of type typ (the
// nested and byte-order flags masked off).
func attr(b []byte, typ uint16) ([]byte, bool) {
	for len(b) >= 4 {
		n := int(binary.NativeEndian.Uint16(b[0:2]))
		if n < 4 || n > len(b) {
			return nil, false
		}
		if binary.NativeEndian.Uint16(b[2:4])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER) == typ {
			return b[4:n], true
		}
		b = b[min(len(b), (n+3)&^3):]
	}
	return nil, false
}
