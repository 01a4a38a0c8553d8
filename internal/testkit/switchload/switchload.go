// Package switchload is the traffic across a switch between proxies on a
// live node, as TestSwitchKubeProxy (test/netns/e2e) and
// TestSwitchKubeProxyIPVS (test/vm) make and count it, so that the two
// tiers' numbers compare: a stream of new connections to one Service (TCP
// and UDP, alternating; TCP from source ports never reused after a
// failure) and established TCP and UDP flows to another.
package switchload

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// ServeHeld serves port on pod p with connections that stay open: each
// line read is answered "<pod name>\n".
func ServeHeld(t *testing.T, p *netns.Pod, port uint16) error {
	var l net.Listener
	if err := p.Do(func() (err error) { l, err = net.Listen("tcp4", fmt.Sprintf(":%d", port)); return err }); err != nil {
		return err
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := bufio.NewReader(c)
				for {
					if _, err := r.ReadString('\n'); err != nil {
						return
					}
					if _, err := fmt.Fprintf(c, "%s\n", p.PodName); err != nil {
						return
					}
				}
			}()
		}
	}()
	return nil
}

// Load is the traffic across one switch: a stream of new
// connections to web (TCP and UDP, alternating, each from a new source
// port) and established flows to steady (held TCP connections, UDP
// flows from fixed source ports), each exchanging every 100 ms.
type Load struct {
	t              *testing.T
	stopc          chan struct{}
	wg             sync.WaitGroup
	done           atomic.Bool // the switch is complete
	deleted        atomic.Bool // c was deleted
	goneGap        atomic.Int64
	newOK, newFail atomic.Int64
	failedAfter    atomic.Int64
	newAfter       atomic.Int64
	goneAfter      atomic.Int64
	heldBroken     atomic.Int64
	udpBroken      atomic.Int64
	exchanges      atomic.Int64
	firstErr       atomic.Value
	mu             sync.Mutex
	failures       []string // after the switch, the first maxFailures
	maxGap         time.Duration
	maxGapEnd      time.Time
	// udpPorts is, per UDP source port the kernel chose, the last
	// exchange from it: when, and which pod answered.
	udpPorts map[uint16]portUse
}

type portUse struct {
	at   time.Time
	name string
}

// maxFailures bounds the failures a Result lists.
const maxFailures = 20

// Result counts one switch's traffic: new connections before and after
// the switch completed, those that reached the deleted endpoint, and the
// established flows broken.
type Result struct {
	NewTotal, FailedBefore, NewAfter, FailedAfter, GoneAfter int64
	GoneGap                                                  int64
	Held, HeldBroken, UDP, UDPBroken                         int
	Exchanges                                                int64
	FirstErr                                                 any
	// Failures lists the first new connections that failed after the
	// switch: when each started and ended, its protocol and error.
	Failures []string
	// MaxGap is the longest time an established flow went between two
	// exchanges (100 ms apart when nothing holds them up), and MaxGapEnd
	// when it ended: a gap as long as a failed connection's timeout, at
	// its time, says the whole node stalled, not the new connections'
	// path.
	MaxGap    time.Duration
	MaxGapEnd time.Time
}

func (r Result) String() string {
	return fmt.Sprintf("%d new connections (before the switch completed: %d failed, %d to the deleted endpoint by the old rules; after it: %d, %d failed, %d to the deleted endpoint); established: %d TCP (%d broken), %d UDP (%d broken), %d exchanges; first error: %v",
		r.NewTotal, r.FailedBefore, r.GoneGap, r.NewAfter, r.FailedAfter, r.GoneAfter, r.Held, r.HeldBroken, r.UDP, r.UDPBroken, r.Exchanges, r.FirstErr)
}

// maxNew bounds the new connections of a Load: five minutes at the rate
// of a namespace world (2,000 a second), twice.
const maxNew = 1_200_000

// HeldFlows and UDPFlows are the established flows of a Load.
const HeldFlows, UDPFlows = 4, 4

// Start starts the traffic from client: new connections to web:80 (TCP
// and UDP), held TCP flows to steady:heldPort and UDP flows to
// steady:80. It ends with Stop (or after five minutes).
func Start(t *testing.T, client *netns.NS, ports *SourcePorts, web, steady netip.Addr, heldPort uint16) *Load {
	t.Helper()
	s := &Load{t: t, stopc: make(chan struct{}), udpPorts: map[uint16]portUse{}}
	deadline := time.Now().Add(5 * time.Minute)
	// Established TCP flows.
	for i := range HeldFlows {
		var c net.Conn
		if err := client.Do(func() (err error) {
			c, err = net.DialTimeout("tcp", netip.AddrPortFrom(steady, heldPort).String(), 2*time.Second)
			return err
		}); err != nil {
			t.Fatalf("held flow %d: %v", i, err)
		}
		s.flow(c, deadline, &s.heldBroken, fmt.Sprintf("held TCP flow %d", i))
	}
	// Established UDP flows: fixed source ports.
	for i := range UDPFlows {
		var c net.Conn
		if err := client.Do(func() (err error) {
			c, err = net.DialUDP("udp4", &net.UDPAddr{Port: 40100 + i}, net.UDPAddrFromAddrPort(netip.AddrPortFrom(steady, 80)))
			return err
		}); err != nil {
			t.Fatalf("UDP flow %d: %v", i, err)
		}
		s.flow(c, deadline, &s.udpBroken, fmt.Sprintf("UDP flow %d", i))
	}
	// The stream of new connections.
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		// Five minutes end it; the count is a backstop above what they
		// allow. A cap of 20,000 ran out in ~10 s at the ~2,000
		// connections a second a namespace world makes, before a slow
		// switch (edgeproxy cleanup, then kube-proxy's first sync) was
		// complete: the stream stopped, and "100 new connections not
		// made within 2m" failed TestSwitchKubeProxy.
		for i := 0; i < maxNew && time.Now().Before(deadline); i++ {
			select {
			case <-s.stopc:
				return
			default:
			}
			// Read before the connection starts: one under way when
			// the switch completes is not "after".
			after := s.done.Load()
			began := time.Now()
			var r netns.Reply
			var err error
			proto := "tcp"
			if i%2 == 0 {
				port := ports.take()
				r, err = client.TCPFrom(netip.AddrPortFrom(web, 80), port, 2*time.Second)
				if err != nil {
					ports.spoil(port)
				}
			} else {
				proto = "udp"
				r, err = client.UDP(netip.AddrPortFrom(web, 80), 0, 2*time.Second)
			}
			// What the source port last did: a failure from a port
			// reused soon after a flow to an endpoint now gone points
			// at state that outlived it (conntrack, IPVS connections).
			reuse := ""
			if port := r.Local.Port(); proto == "udp" && port != 0 {
				s.mu.Lock()
				if u, ok := s.udpPorts[port]; ok {
					reuse = fmt.Sprintf(" (port %d last answered by %s at %s)", port, u.name, u.at.Format("15:04:05.000"))
				}
				if err == nil {
					s.udpPorts[port] = portUse{at: time.Now(), name: r.Name}
				}
				s.mu.Unlock()
			}
			if after {
				s.newAfter.Add(1)
			}
			switch {
			case err != nil:
				s.newFail.Add(1)
				if after {
					s.failedAfter.Add(1)
					s.firstErr.CompareAndSwap(nil, fmt.Sprintf("%s at %s: %v", proto, time.Now().Format("15:04:05.000"), err))
					s.mu.Lock()
					if len(s.failures) < maxFailures {
						s.failures = append(s.failures, fmt.Sprintf("%s %s–%s: %v%s", proto,
							began.Format("15:04:05.000"), time.Now().Format("15:04:05.000"), err, reuse))
					}
					s.mu.Unlock()
				}
			default:
				s.newOK.Add(1)
				switch {
				case r.Name != "c":
				case after:
					s.goneAfter.Add(1)
					s.firstErr.CompareAndSwap(nil, fmt.Sprintf("%s from %s to the deleted endpoint at %s", proto, r.Client, time.Now().Format("15:04:05.000")))
				case s.deleted.Load():
					s.goneGap.Add(1)
				}
			}
		}
	}()
	return s
}

// SourcePorts hands out the stream's TCP source ports, below the kernel's
// ephemeral range (the established flows' ports), in turn, and never
// again one whose connection failed. A SYN sent while no proxy's rules
// are in place (the way back, between `edgeproxy cleanup` and kube-proxy's
// first sync) leaves an unreplied conntrack entry with no DNAT in the
// node, and a later SYN of the same four-tuple follows that entry, not the
// new rules, for as long as SYN_SENT's timeout (120 s, renewed by each
// resend): with either proxy. The kernel's own choice of port comes back
// to the same one within a few thousand connections (RFC 6056's random
// increments), so a failure before one switch failed a connection after
// the next one.
type SourcePorts struct {
	mu     sync.Mutex
	next   uint16
	spoilt map[uint16]bool // failed, and the ports to avoid
}

const firstSourcePort, lastSourcePort = 10000, 32767

// NewSourcePorts hands out ports but those in avoid (the servers' own).
func NewSourcePorts(avoid ...uint16) *SourcePorts {
	p := &SourcePorts{next: firstSourcePort, spoilt: map[uint16]bool{}}
	for _, a := range avoid {
		p.spoilt[a] = true
	}
	return p
}

func (p *SourcePorts) take() uint16 {
	p.mu.Lock()
	defer p.mu.Unlock()
	for range lastSourcePort - firstSourcePort + 1 {
		port := p.next
		if p.next++; p.next > lastSourcePort {
			p.next = firstSourcePort
		}
		if !p.spoilt[port] {
			return port
		}
	}
	return 0 // every port failed once: the kernel's choice
}

func (p *SourcePorts) spoil(port uint16) {
	p.mu.Lock()
	p.spoilt[port] = true
	p.mu.Unlock()
}

// flow exchanges a line on c every 100 ms until stopped; an exchange that
// fails, or that another pod answers than the first, breaks the flow
// (counted once in broken; the flow ends).
func (s *Load) flow(c net.Conn, deadline time.Time, broken *atomic.Int64, what string) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer c.Close()
		r := bufio.NewReader(c)
		first := ""
		last := time.Now()
		for time.Now().Before(deadline) {
			select {
			case <-s.stopc:
				return
			case <-time.After(100 * time.Millisecond):
			}
			_ = c.SetDeadline(time.Now().Add(3 * time.Second))
			if _, err := io.WriteString(c, "x\n"); err != nil {
				s.broke(broken, fmt.Errorf("%s: write: %w", what, err))
				return
			}
			line, err := r.ReadString('\n')
			if err != nil {
				s.broke(broken, fmt.Errorf("%s: read: %w", what, err))
				return
			}
			name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
			if first == "" {
				first = name
			} else if name != first {
				s.broke(broken, fmt.Errorf("%s: moved from %s to %s", what, first, name))
				return
			}
			s.exchanges.Add(1)
			now := time.Now()
			s.mu.Lock()
			if gap := now.Sub(last); gap > s.maxGap {
				s.maxGap, s.maxGapEnd = gap, now
			}
			s.mu.Unlock()
			last = now
		}
	}()
}

func (s *Load) broke(n *atomic.Int64, err error) {
	n.Add(1)
	s.firstErr.CompareAndSwap(nil, err.Error())
}

// WaitNew waits (bounded) until n more new connections have been made.
func (s *Load) WaitNew(n int64) {
	s.t.Helper()
	from := s.newOK.Load() + s.newFail.Load()
	deadline := time.Now().Add(2 * time.Minute)
	for s.newOK.Load()+s.newFail.Load() < from+n {
		if time.Now().After(deadline) {
			s.t.Fatalf("%d new connections not made within 2m", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitExchanges waits (bounded) until the established flows have made n
// more exchanges, so that each one crosses the switch, or until every
// flow has broken (none makes an exchange again): a switch that does not
// carry the flows over (IPVS mode's to iptables or nftables mode) broke
// them all in some runs, which is a count for Stop's Result to report,
// not a timeout.
func (s *Load) WaitExchanges(n int64) {
	s.t.Helper()
	from := s.exchanges.Load()
	deadline := time.Now().Add(time.Minute)
	for s.exchanges.Load() < from+n && s.heldBroken.Load()+s.udpBroken.Load() < HeldFlows+UDPFlows {
		if time.Now().After(deadline) {
			s.t.Fatalf("%d exchanges on the established flows not made within 1m (%d)", n, s.exchanges.Load()-from)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Deleted records that the streamed Service's endpoint "c" is deleted: a
// connection that reaches it from now on shows stale rules.
func (s *Load) Deleted() { s.deleted.Store(true) }

// Switched marks the switch complete: what follows is "after".
func (s *Load) Switched() { s.done.Store(true) }

// Stop ends the traffic and counts it.
func (s *Load) Stop() Result {
	close(s.stopc)
	s.wg.Wait()
	r := Result{
		NewTotal: s.newOK.Load() + s.newFail.Load(), FailedAfter: s.failedAfter.Load(), NewAfter: s.newAfter.Load(),
		GoneAfter: s.goneAfter.Load(), GoneGap: s.goneGap.Load(), Held: HeldFlows, HeldBroken: int(s.heldBroken.Load()),
		UDP: UDPFlows, UDPBroken: int(s.udpBroken.Load()), Exchanges: s.exchanges.Load(), FirstErr: s.firstErr.Load(),
	}
	r.FailedBefore = s.newFail.Load() - r.FailedAfter
	s.mu.Lock()
	r.Failures = slices.Clone(s.failures)
	r.MaxGap, r.MaxGapEnd = s.maxGap, s.maxGapEnd
	s.mu.Unlock()
	return r
}
