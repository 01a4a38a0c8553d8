// Package health probes endpoints while the API server is away: when
// EndpointSlices are frozen, a pod that died keeps its share of traffic
// until the link returns. The prober connects to each endpoint of the
// programmed plan at a bounded rate and concurrency, and keeps a verdict
// per endpoint that the agent uses to leave failed endpoints out.
//
// It is pure scheduling and bookkeeping: the dial is injected (the agent
// dials TCP from the node's own network namespace), so the logic is tested
// without a network and the rate cap is measured with 1,000 endpoints.
package prober

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// State is what the prober thinks of one endpoint.
type State int

const (
	// Unknown: not yet probed to a threshold; the endpoint is kept.
	Unknown State = iota
	// Healthy: passed successThreshold probes in a row.
	Healthy
	// Failed: failed failureThreshold probes in a row; left out unless
	// every endpoint of its port failed.
	Failed
)

// States lists every state, for bounded metric labels.
var States = []State{Unknown, Healthy, Failed}

func (s State) String() string {
	switch s {
	case Healthy:
		return "healthy"
	case Failed:
		return "failed"
	default:
		return "unknown"
	}
}

// Target is what one probe checks: an endpoint's address and the port
// and protocol to probe (the target port over TCP unless the Service
// names another, see the agent's edgeproxy.io/offline-probe).
type Target struct {
	Addr netip.AddrPort
	UDP  bool
}

func (t Target) String() string {
	if t.UDP {
		return t.Addr.String() + "/udp"
	}
	return t.Addr.String()
}

// DialFunc makes one probe of t; nil means it passed. It must return by
// ctx's deadline.
type DialFunc func(ctx context.Context, t Target) error

// Options tune the prober. Zero values take the defaults of Defaults.
type Options struct {
	Interval         time.Duration // between two probes of one endpoint
	Timeout          time.Duration // of one probe
	FailureThreshold int           // failures in a row to mark Failed
	SuccessThreshold int           // passes in a row to mark Healthy again
	RatePerSecond    int           // cap on probes started per second, all endpoints together
	Concurrency      int           // cap on probes in flight
	Jitter           float64       // each wait is spread by ± this fraction of Interval (0..1)
	Dial             DialFunc      // default: TCP connect
	OnChange         func()        // called (outside the lock) when an endpoint changes state
}

// Defaults are the values of health.* in configs/edgeproxy.yaml.
var Defaults = Options{
	Interval: 5 * time.Second, Timeout: time.Second,
	FailureThreshold: 3, SuccessThreshold: 1,
	RatePerSecond: 100, Concurrency: 16, Jitter: 0.2,
}

func (o Options) withDefaults() Options {
	d := Defaults
	if o.Interval > 0 {
		d.Interval = o.Interval
	}
	if o.Timeout > 0 {
		d.Timeout = o.Timeout
	}
	if o.FailureThreshold > 0 {
		d.FailureThreshold = o.FailureThreshold
	}
	if o.SuccessThreshold > 0 {
		d.SuccessThreshold = o.SuccessThreshold
	}
	if o.RatePerSecond > 0 {
		d.RatePerSecond = o.RatePerSecond
	}
	if o.Concurrency > 0 {
		d.Concurrency = o.Concurrency
	}
	if o.Jitter > 0 && o.Jitter <= 1 {
		d.Jitter = o.Jitter
	}
	d.Dial, d.OnChange = o.Dial, o.OnChange
	if d.Dial == nil {
		d.Dial = Dial
	}
	return d
}

// Dial probes t from the calling process's network namespace: DialTCP or
// DialUDP.
func Dial(ctx context.Context, t Target) error {
	if t.UDP {
		return DialUDP(ctx, t.Addr)
	}
	return DialTCP(ctx, t.Addr)
}

// DialTCP probes addr with a TCP connect, closed at once.
func DialTCP(ctx context.Context, addr netip.AddrPort) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr.String())
	if err != nil {
		return err
	}
	return c.Close()
}

// udpProbe is the datagram a UDP probe sends.
var udpProbe = []byte("edgeproxy-probe\n")

// DialUDP probes addr with one datagram on a connected socket and waits
// until ctx's deadline for an answer. UDP cannot prove that a server
// lives, only that it is gone: an ICMP error (port or host unreachable,
// reported by the kernel on the next read) fails the probe; an answer or
// silence passes it.
func DialUDP(ctx context.Context, addr netip.AddrPort) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp", addr.String())
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		if err := c.SetDeadline(dl); err != nil {
			return err
		}
	}
	if _, err := c.Write(udpProbe); err != nil {
		return err
	}
	var buf [64]byte
	if _, err := c.Read(buf[:]); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil // silence: nothing says the server is gone
		}
		return err
	}
	return nil
}

// Verdict is the prober's view of one endpoint.
type Verdict struct {
	State    State
	Failures int       // failures in a row
	Since    time.Time // when the current run of failures (or passes) began
	Err      string    // the last probe's error, if it failed
}

// Reason says why an endpoint is left out, for `explain`:
// "probe: 3 failures since 12:04:31".
func (v Verdict) Reason() string {
	if v.State != Failed {
		return ""
	}
	return fmt.Sprintf("probe: %d failures since %s (%s)", v.Failures, v.Since.Format(time.TimeOnly), v.Err)
}

type target struct {
	Verdict
	passes   int
	next     time.Time
	inFlight bool
}

// Prober probes a set of endpoints; safe for concurrent use.
type Prober struct {
	opts    Options
	mu      sync.Mutex
	targets map[Target]*target
	changed chan struct{} // the set of targets changed
	probes  atomic.Int64  // probes started, for tests and metrics
}

// New returns a prober with no targets; Run starts probing.
func New(opts Options) *Prober {
	return &Prober{opts: opts.withDefaults(), targets: map[Target]*target{}, changed: make(chan struct{}, 1)}
}

// Probes returns how many probes were started.
func (p *Prober) Probes() int64 { return p.probes.Load() }

// SetTargets makes addrs the endpoints to probe: new ones start Unknown
// and are first probed within one jittered interval (spread, so a large
// set does not probe in one burst); gone ones are forgotten.
func (p *Prober) SetTargets(addrs []Target) {
	now := time.Now()
	p.mu.Lock()
	keep := make(map[Target]bool, len(addrs))
	for _, a := range addrs {
		keep[a] = true
		if _, ok := p.targets[a]; !ok {
			first := time.Duration(rand.Int64N(int64(p.opts.Interval)))
			p.targets[a] = &target{next: now.Add(first)}
		}
	}
	for a := range p.targets {
		if !keep[a] {
			delete(p.targets, a)
		}
	}
	p.mu.Unlock()
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// Reset drops every verdict (the API server is back: its EndpointSlices
// are the truth again); the targets stay and start from Unknown.
func (p *Prober) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for a, t := range p.targets {
		p.targets[a] = &target{next: t.next}
	}
}

// Verdict returns the verdict for addr (Unknown when it is no target).
func (p *Prober) Verdict(addr Target) Verdict {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t, ok := p.targets[addr]; ok {
		return t.Verdict
	}
	return Verdict{}
}

// Verdicts returns the verdict of every target.
func (p *Prober) Verdicts() map[Target]Verdict {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[Target]Verdict, len(p.targets))
	for a, t := range p.targets {
		out[a] = t.Verdict
	}
	return out
}

// Counts returns how many targets are in each state.
func (p *Prober) Counts() map[State]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[State]int, len(States))
	for _, s := range States {
		out[s] = 0
	}
	for _, t := range p.targets {
		out[t.State]++
	}
	return out
}

// Run probes until ctx is done. Probes start at most RatePerSecond per
// second and at most Concurrency at once; a probe in flight when ctx ends
// is cancelled with it, and Run waits for it (bounded by Timeout).
func (p *Prober) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, p.opts.Concurrency)
	pace := time.NewTicker(time.Second / time.Duration(p.opts.RatePerSecond))
	defer pace.Stop()
	for {
		addr, wait := p.due(time.Now())
		if !addr.Addr.IsValid() {
			if !sleep(ctx, wait, p.changed) {
				return
			}
			continue
		}
		select { // the rate cap
		case <-ctx.Done():
			p.release(addr)
			return
		case <-pace.C:
		}
		select { // the concurrency cap
		case <-ctx.Done():
			p.release(addr)
			return
		case sem <- struct{}{}:
		}
		p.probes.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			pctx, cancel := context.WithTimeout(ctx, p.opts.Timeout)
			err := p.opts.Dial(pctx, addr)
			cancel()
			if ctx.Err() != nil {
				p.release(addr)
				return
			}
			if p.record(addr, err, time.Now()) && p.opts.OnChange != nil {
				p.opts.OnChange()
			}
		}()
	}
}

// sleep waits for d (0: no time limit), ctx or a change of targets; false
// when ctx is done. A prober without targets (the API server is there)
// sleeps until it gets some: no wake-ups on a quiet node.
func sleep(ctx context.Context, d time.Duration, changed <-chan struct{}) bool {
	var fire <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		fire = t.C
	}
	select {
	case <-ctx.Done():
		return false
	case <-changed:
	case <-fire:
	}
	return true
}

// due returns the target whose probe is most overdue and marks it in
// flight, or an invalid address and how long to wait for the next one.
func (p *Prober) due(now time.Time) (Target, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var best Target
	found := false
	var bestAt time.Time
	for a, t := range p.targets {
		if t.inFlight {
			continue
		}
		if !found || t.next.Before(bestAt) {
			best, bestAt, found = a, t.next, true
		}
	}
	switch {
	case len(p.targets) == 0:
		return Target{}, 0 // nothing to probe: wait for targets
	case !found:
		return Target{}, p.opts.Interval // every target in flight
	}
	if wait := bestAt.Sub(now); wait > 0 {
		return Target{}, wait
	}
	p.targets[best].inFlight = true
	return best, 0
}

func (p *Prober) release(addr Target) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t, ok := p.targets[addr]; ok {
		t.inFlight = false
	}
}

// record counts one probe's result against the thresholds and schedules
// the next probe one jittered interval later. It reports whether the
// endpoint's state changed.
func (p *Prober) record(addr Target, err error, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.targets[addr]
	if !ok {
		return false // dropped while the probe ran
	}
	was := t.State
	t.inFlight = false
	t.next = now.Add(p.jittered())
	if err != nil {
		if t.Failures == 0 {
			t.Since = now
		}
		t.Failures++
		t.passes = 0
		t.Err = errText(err)
		if t.Failures >= p.opts.FailureThreshold {
			t.State = Failed
		}
		return t.State != was
	}
	if t.passes == 0 {
		t.Since = now
	}
	t.passes++
	t.Failures, t.Err = 0, ""
	if t.passes >= p.opts.SuccessThreshold {
		t.State = Healthy
	}
	return t.State != was
}

func (p *Prober) jittered() time.Duration {
	j := p.opts.Jitter * (2*rand.Float64() - 1)
	return time.Duration(float64(p.opts.Interval) * (1 + j))
}

func errText(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	return err.Error()
}

// Keep says which endpoints of one port stay in the plan: all but the
// failed ones, or all of them when every one failed (never blackhole a
// port on the prober's own judgement).
func Keep(failed []bool) []bool {
	keep := make([]bool, len(failed))
	all := len(failed) > 0
	for i, f := range failed {
		keep[i] = !f
		all = all && f
	}
	if all {
		for i := range keep {
			keep[i] = true
		}
	}
	return keep
}
