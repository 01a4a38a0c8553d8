package notify

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// guard bounds every wait on another goroutine. It is a hang guard, never
// a timing assertion: tests step a fake clock.
const guard = 10 * time.Second

// listen creates a real unixgram socket, as systemd does, and points
// NOTIFY_SOCKET at it.
func listen(t *testing.T) *net.UnixConn {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	t.Setenv("WATCHDOG_PID", "")
	return conn
}

// drain returns the datagrams waiting on conn without blocking. SdNotify
// writes synchronously, so a message sent before drain is already queued.
func drain(t *testing.T, conn *net.UnixConn) []string {
	t.Helper()
	rc, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var msgs []string
	buf := make([]byte, 4096)
	for range 1000 {
		var n int
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			n, rerr = syscall.Read(int(fd), buf) // the socket is non-blocking
			return true
		}); err != nil {
			t.Fatal(err)
		}
		if errors.Is(rerr, syscall.EAGAIN) {
			return msgs
		}
		if rerr != nil {
			t.Fatal(rerr)
		}
		msgs = append(msgs, string(buf[:n]))
	}
	t.Fatal("more than 1000 messages queued")
	return nil
}

type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	tickers chan *fakeTicker
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), tickers: make(chan *fakeTicker, 1)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

func (c *fakeClock) NewTicker(d time.Duration) Ticker {
	t := &fakeTicker{period: d, c: make(chan time.Time), stopped: make(chan struct{})}
	c.tickers <- t
	return t
}

type fakeTicker struct {
	period  time.Duration
	c       chan time.Time
	once    sync.Once
	stopped chan struct{}
}

func (t *fakeTicker) C() <-chan time.Time { return t.c }
func (t *fakeTicker) Stop()               { t.once.Do(func() { close(t.stopped) }) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestNoSocketIsNoOp(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	t.Setenv("WATCHDOG_USEC", "1000000")
	n, err := New(Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if n.Enabled() || n.WatchdogInterval() != 0 {
		t.Fatalf("Enabled=%v WatchdogInterval=%v without NOTIFY_SOCKET", n.Enabled(), n.WatchdogInterval())
	}
	for _, err := range []error{n.MarkReady("x"), n.Status("y"), n.Stopping()} {
		if err != nil {
			t.Errorf("no-op send failed: %v", err)
		}
	}
	n.Progress()
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	if err := n.Run(ctx); err != nil || ctx.Err() != nil {
		t.Fatalf("Run without NOTIFY_SOCKET = %v after ctx %v; want nil at once", err, ctx.Err())
	}
}

func TestReadyOnlyAfterMarkReady(t *testing.T) {
	conn := listen(t)
	t.Setenv("WATCHDOG_USEC", "")
	n, err := New(Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if !n.Enabled() {
		t.Fatal("not enabled with NOTIFY_SOCKET set")
	}
	if err := n.Status("waiting for the API server"); err != nil {
		t.Fatal(err)
	}
	n.Progress()
	n.Progress()
	if got, want := drain(t, conn), []string{"STATUS=waiting for the API server"}; !slices.Equal(got, want) {
		t.Fatalf("before MarkReady got %q, want %q", got, want)
	}
	if n.Ready() {
		t.Fatal("Ready before MarkReady")
	}

	if err := n.MarkReady("programmed 3 services from snapshot"); err != nil {
		t.Fatal(err)
	}
	if got, want := drain(t, conn), []string{"READY=1\nSTATUS=programmed 3 services from snapshot"}; !slices.Equal(got, want) {
		t.Fatalf("MarkReady sent %q, want %q", got, want)
	}
	if !n.Ready() {
		t.Fatal("not Ready after MarkReady")
	}

	// READY=1 goes out once; a second MarkReady only updates the status,
	// and a status cannot smuggle in another assignment.
	if err := n.MarkReady("synced from the API\nREADY=1"); err != nil {
		t.Fatal(err)
	}
	if got, want := drain(t, conn), []string{"STATUS=synced from the API READY=1"}; !slices.Equal(got, want) {
		t.Fatalf("second MarkReady sent %q, want %q", got, want)
	}
	if err := n.Stopping(); err != nil {
		t.Fatal(err)
	}
	if got, want := drain(t, conn), []string{"STOPPING=1"}; !slices.Equal(got, want) {
		t.Fatalf("Stopping sent %q, want %q", got, want)
	}
}

// harness runs a Notifier's watchdog loop on a fake clock.
type harness struct {
	t      *testing.T
	conn   *net.UnixConn
	n      *Notifier
	clock  *fakeClock
	ticker *fakeTicker
	ticked chan bool
	start  time.Time
}

func startWatchdog(t *testing.T, usec int) *harness {
	t.Helper()
	return startWatchdogWith(t, usec, nil)
}

func startWatchdogWith(t *testing.T, usec int, owed func() time.Time) *harness {
	t.Helper()
	conn := listen(t)
	t.Setenv("WATCHDOG_USEC", strconv.Itoa(usec))
	clock := newFakeClock()
	n, err := New(Options{Logger: quiet, Clock: clock, Owed: owed})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, conn: conn, n: n, clock: clock, ticked: make(chan bool), start: clock.Now()}
	n.ticked = func(p bool) { h.ticked <- p }

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(guard):
			t.Error("Run did not return after cancel")
		}
		select {
		case <-h.ticker.stopped:
		default:
			t.Error("Run did not stop its ticker")
		}
	})
	select {
	case h.ticker = <-clock.tickers:
	case <-time.After(guard):
		t.Fatal("Run created no ticker")
	}
	return h
}

// at moves the clock to start+d.
func (h *harness) at(d time.Duration) { h.clock.set(h.start.Add(d)) }

// tick fires the ticker at start+d and returns whether a ping was sent and
// what arrived on the socket.
func (h *harness) tick(d time.Duration) (bool, []string) {
	h.t.Helper()
	h.at(d)
	select {
	case h.ticker.c <- h.clock.Now():
	case <-time.After(guard):
		h.t.Fatal("Run does not read its ticker")
	}
	var pinged bool
	select {
	case pinged = <-h.ticked:
	case <-time.After(guard):
		h.t.Fatal("Run did not finish the tick")
	}
	return pinged, drain(h.t, h.conn)
}

func (h *harness) expectPing(d time.Duration) {
	h.t.Helper()
	pinged, msgs := h.tick(d)
	if !pinged || !slices.Equal(msgs, []string{"WATCHDOG=1"}) {
		h.t.Fatalf("tick at +%v: pinged=%v, socket got %q; want one WATCHDOG=1", d, pinged, msgs)
	}
}

func (h *harness) expectSilence(d time.Duration) {
	h.t.Helper()
	pinged, msgs := h.tick(d)
	if pinged || len(msgs) != 0 {
		h.t.Fatalf("tick at +%v: pinged=%v, socket got %q; want nothing (loop wedged)", d, pinged, msgs)
	}
}

func TestWatchdogFollowsProgress(t *testing.T) {
	h := startWatchdog(t, 2_000_000) // WatchdogSec=2s
	if h.n.WatchdogInterval() != 2*time.Second {
		t.Fatalf("WatchdogInterval = %v, want 2s", h.n.WatchdogInterval())
	}
	if h.ticker.period != time.Second {
		t.Fatalf("ticker period %v, want half the watchdog interval", h.ticker.period)
	}
	// Start-up counts as progress.
	h.expectPing(1 * time.Second)

	// The loop keeps finishing attempts (whether they reach the API or
	// not is none of the watchdog's business): pings go on.
	for i := 2; i <= 6; i++ {
		h.at(time.Duration(i)*time.Second - 300*time.Millisecond)
		h.n.Progress()
		h.expectPing(time.Duration(i) * time.Second)
	}

	// The loop wedges after its attempt at 5.7s. A ping is still due while
	// that attempt is within the interval (7s, 7.7s), then they stop.
	h.expectPing(7 * time.Second)
	h.expectPing(7700 * time.Millisecond)
	h.expectSilence(8 * time.Second)
	h.expectSilence(9 * time.Second)
	h.expectSilence(60 * time.Second)

	// Unwedged: pings resume with the next progress.
	h.at(60*time.Second + 500*time.Millisecond)
	h.n.Progress()
	h.expectPing(61 * time.Second)
}

// Pings flow before READY=1 too: systemd ignores them until start-up is
// done, and they never imply readiness.
func TestWatchdogDoesNotSendReady(t *testing.T) {
	h := startWatchdog(t, 1_000_000)
	h.n.Progress()
	h.expectPing(500 * time.Millisecond)
	if h.n.Ready() {
		t.Fatal("watchdog made the notifier ready")
	}
}

// The same loop on the real clock: pings arrive on the socket and Run ends
// with its context. Only the arrival is checked, never the timing.
func TestWatchdogRealClock(t *testing.T) {
	conn := listen(t)
	t.Setenv("WATCHDOG_USEC", "100000")
	n, err := New(Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(guard):
			t.Error("Run did not return after cancel")
		}
	}()
	stop := make(chan struct{})
	defer close(stop)
	go func() { // the sync loop
		tk := time.NewTicker(10 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				n.Progress()
			}
		}
	}()
	buf := make([]byte, 256)
	for range 3 {
		if err := conn.SetReadDeadline(time.Now().Add(guard)); err != nil {
			t.Fatal(err)
		}
		k, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("no watchdog ping: %v", err)
		}
		if string(buf[:k]) != "WATCHDOG=1" {
			t.Fatalf("got %q, want WATCHDOG=1", buf[:k])
		}
	}
}

func TestWatchdogEnvironment(t *testing.T) {
	listen(t)
	t.Setenv("WATCHDOG_USEC", "not-a-number")
	if _, err := New(Options{Logger: quiet}); err == nil {
		t.Error("New accepted WATCHDOG_USEC=not-a-number")
	}
	// The watchdog is meant for another process (e.g. inherited).
	t.Setenv("WATCHDOG_USEC", "1000000")
	t.Setenv("WATCHDOG_PID", "1")
	n, err := New(Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if n.WatchdogInterval() != 0 {
		t.Errorf("WatchdogInterval = %v for another process's watchdog, want 0", n.WatchdogInterval())
	}
}

// With Options.Owed, a loop that sleeps with nothing to do keeps the pings
// going however long since its last attempt; one that owes an attempt for
// a whole interval without making it stops them, and a retrying loop (an
// attempt after each failure) does not.
func TestWatchdogFollowsWhatTheLoopOwes(t *testing.T) {
	var owed time.Time // guarded by the harness's lockstep: set between ticks
	var mu sync.Mutex
	h := startWatchdogWith(t, 2_000_000, func() time.Time { mu.Lock(); defer mu.Unlock(); return owed })
	owe := func(d time.Duration) { mu.Lock(); owed = h.start.Add(d); mu.Unlock() }

	// Nothing owed: an hour without an attempt is sleep, not a hang.
	h.expectPing(time.Hour)

	// A request at +1h; the attempt hangs. Pings go on for one interval,
	// then stop.
	owe(time.Hour)
	h.expectPing(time.Hour + time.Second)
	h.expectPing(time.Hour + 2*time.Second)
	h.expectSilence(time.Hour + 3*time.Second)

	// The attempt ends in failure; the retries keep making attempts while
	// the request stays owed: pings resume.
	h.at(time.Hour + 3500*time.Millisecond)
	h.n.Progress()
	h.expectPing(time.Hour + 4*time.Second)
	h.at(time.Hour + 5*time.Second)
	h.n.Progress()
	h.expectPing(time.Hour + 6*time.Second)

	// Served: nothing owed again.
	mu.Lock()
	owed = time.Time{}
	mu.Unlock()
	h.expectPing(2 * time.Hour)
}
