// Package notify speaks systemd's notify protocol for the agent: READY=1
// once the kernel was first programmed, STATUS= lines, and WATCHDOG=1 pings
// that prove the sync loop still makes progress.
//
// The watchdog follows the sync loop, not the API server: the loop calls
// Progress after every sync attempt, successful or not, and Run pings
// systemd only while the last Progress is younger than the watchdog
// interval. A loop that may sleep for longer than that with nothing to do
// says what it owes instead (Options.Owed): then the pings stop only when
// it has owed an attempt for a whole interval without making one. An
// unreachable control plane leaves the node "stale", and the pings go on; a
// wedged loop stops them, and systemd restarts the agent (sending SIGABRT
// first, so Go prints every goroutine's stack to the journal).
//
// Without NOTIFY_SOCKET (not started by systemd, or Type= is not notify)
// every method is a no-op.
package notify

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// Clock is the notifier's time source; tests inject a fake one.
type Clock interface {
	Now() time.Time
	NewTicker(d time.Duration) Ticker
}

// Ticker is the part of time.Ticker the notifier uses.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }
func (realClock) NewTicker(d time.Duration) Ticker {
	return realTicker{time.NewTicker(d)}
}

type realTicker struct{ t *time.Ticker }

func (t realTicker) C() <-chan time.Time { return t.t.C }
func (t realTicker) Stop()               { t.t.Stop() }

// Options configure a Notifier. The zero value is ready to use.
type Options struct {
	Logger *slog.Logger // default slog.Default()
	Clock  Clock        // default the system clock
	// Owed, when set, reports since when the loop has owed an attempt: a
	// run requested or in progress (zero: it owes none, and sleeping is
	// not hanging). The watchdog then stops pinging only when the loop has
	// owed an attempt for longer than the interval and made none since.
	Owed func() time.Time
}

// Notifier sends the agent's state to systemd. It is safe for concurrent
// use.
type Notifier struct {
	log      *slog.Logger
	clock    Clock
	enabled  bool          // NOTIFY_SOCKET is set
	watchdog time.Duration // WatchdogSec; 0 when off
	owed     func() time.Time

	mu           sync.Mutex
	ready        bool
	lastProgress time.Time

	// ticked, when set by a test, hears the outcome of every watchdog tick.
	ticked func(pinged bool)
}

// New reads NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID from the
// environment (leaving them set). Its only error is a malformed
// WATCHDOG_USEC or WATCHDOG_PID.
func New(o Options) (*Notifier, error) {
	n := &Notifier{log: o.Logger, clock: o.Clock, owed: o.Owed}
	if n.log == nil {
		n.log = slog.Default()
	}
	if n.clock == nil {
		n.clock = realClock{}
	}
	n.log = n.log.With("component", "notify")
	n.enabled = os.Getenv("NOTIFY_SOCKET") != ""
	if n.enabled {
		wd, err := daemon.SdWatchdogEnabled(false)
		if err != nil {
			return nil, fmt.Errorf("notify: watchdog settings: %w", err)
		}
		n.watchdog = wd
	}
	// Starting counts as progress: the first sync gets one full watchdog
	// interval to finish its first attempt.
	n.lastProgress = n.clock.Now()
	return n, nil
}

// Enabled reports whether systemd listens (NOTIFY_SOCKET is set).
func (n *Notifier) Enabled() bool { return n.enabled }

// WatchdogInterval is systemd's WatchdogSec for this process, or 0 when
// the watchdog is off.
func (n *Notifier) WatchdogInterval() time.Duration { return n.watchdog }

// MarkReady tells systemd that start-up is done: call it after the first
// successful programming of the kernel, from the API or from the snapshot.
// Only the first call sends READY=1; later calls just update the status.
func (n *Notifier) MarkReady(status string) error {
	n.mu.Lock()
	first := !n.ready
	n.ready = true
	n.mu.Unlock()
	if !first {
		return n.Status(status)
	}
	msg := daemon.SdNotifyReady
	if status != "" {
		msg += "\nSTATUS=" + oneLine(status)
	}
	return n.send(msg)
}

// Ready reports whether MarkReady was called.
func (n *Notifier) Ready() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ready
}

// Status sets the one-line status `systemctl status` shows. Newlines are
// replaced: each line of a notify message is an assignment of its own.
func (n *Notifier) Status(status string) error {
	return n.send("STATUS=" + oneLine(status))
}

// Stopping tells systemd the agent is shutting down.
func (n *Notifier) Stopping() error { return n.send(daemon.SdNotifyStopping) }

// Progress records that the sync loop finished an attempt, whatever its
// outcome. Cheap; call it after every attempt.
func (n *Notifier) Progress() {
	now := n.clock.Now()
	n.mu.Lock()
	n.lastProgress = now
	n.mu.Unlock()
}

// Run pings the watchdog every half interval while progress is recent, until
// ctx is done. It returns nil at once when systemd does not watch the
// process (no NOTIFY_SOCKET or no WatchdogSec).
func (n *Notifier) Run(ctx context.Context) error {
	if !n.enabled || n.watchdog <= 0 {
		return nil
	}
	t := n.clock.NewTicker(n.watchdog / 2)
	defer t.Stop()
	n.log.Debug("watchdog running", "interval", n.watchdog)
	stale := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C():
			pinged := n.tick(now, &stale)
			if n.ticked != nil {
				n.ticked(pinged)
			}
		}
	}
}

// tick pings if the last progress is at most one watchdog interval old,
// or, with Options.Owed, if the loop owes nothing or has owed it (or made
// an attempt) for at most one interval.
func (n *Notifier) tick(now time.Time, stale *bool) bool {
	n.mu.Lock()
	last := n.lastProgress
	n.mu.Unlock()
	age := now.Sub(last)
	if n.owed != nil {
		age = 0
		if since := n.owed(); !since.IsZero() {
			age = now.Sub(later(since, last))
		}
	}
	if age > n.watchdog {
		if !*stale {
			n.log.Error("sync loop made no progress; withholding watchdog pings", "since", age.Round(time.Millisecond), "watchdog", n.watchdog)
			*stale = true
		}
		return false
	}
	if *stale {
		n.log.Info("sync loop progressing again; resuming watchdog pings")
		*stale = false
	}
	if err := n.send(daemon.SdNotifyWatchdog); err != nil {
		n.log.Warn("watchdog ping failed", "err", err)
		return false
	}
	return true
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (n *Notifier) send(msg string) error {
	if !n.enabled {
		return nil
	}
	if _, err := daemon.SdNotify(false, msg); err != nil {
		return fmt.Errorf("notify: send %q: %w", firstLine(msg), err)
	}
	return nil
}

func oneLine(s string) string {
	return strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(s)
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
