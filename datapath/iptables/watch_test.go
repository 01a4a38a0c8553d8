package iptables_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/iptables"
)

// TestWatchWrites: on iptables-nft, WatchWrites announces foreign writes
// (a table of someone else's, a flush of our chain) and our own, and while
// it runs the tamper monitor trusts an unchanged generation past
// recheckEvery; once it ends, the periodic full check is back.
// iptables-legacy cannot watch: ErrNoWatch at once, and the periodic full
// check stays.
func TestWatchWrites(t *testing.T) {
	eachVariant(t, func(t *testing.T, v iptables.Variant) {
		e := newEnv(t, v, 1, nil)
		plan := &datapath.Plan{Full: true, Frontends: []datapath.Frontend{
			fe("default/x:", datapath.ClusterIP, datapath.TCP, vip, 80, e.ep(0, 1)),
		}}
		e.mustApply(plan)
		tampered := func() bool {
			t.Helper()
			// Past the spacing of slow checks (see Tampered), which
			// would otherwise answer no without looking.
			iptables.Age(e.p, 15*time.Second)
			var got bool
			if err := e.node.Do(func() (err error) { got, err = e.p.Tampered(context.Background()); return err }); err != nil {
				t.Fatal(err)
			}
			return got
		}
		// intact checks that Tampered finds our rules intact, with a full
		// check or without one.
		intact := func(what string, full bool) {
			t.Helper()
			n := iptables.FullTamperChecks(e.p)
			if tampered() {
				t.Fatalf("%s: our rules taken for tampered", what)
			}
			want := 0
			if full {
				want = 1
			}
			if ran := iptables.FullTamperChecks(e.p) - n; ran != want {
				t.Fatalf("%s: %d full checks ran, want %d", what, ran, want)
			}
		}
		// On nf_tables the first apply (a rewrite nothing else was
		// committed beside) verified the tables itself.
		intact("first check after the apply", v == iptables.Legacy)

		ctx, cancel := context.WithCancel(context.Background())
		written := make(chan struct{}, 1)
		done := make(chan error, 1)
		go func() { done <- e.node.Do(func() error { return e.p.WatchWrites(ctx, written) }) }()
		ended := false
		end := func() error {
			t.Helper()
			cancel()
			select {
			case err := <-done:
				ended = true
				return err
			case <-time.After(2 * time.Second):
				t.Fatal("WatchWrites still running 2s after its context ended")
				return nil
			}
		}
		t.Cleanup(func() {
			if !ended {
				_ = end()
			}
		})

		if v == iptables.Legacy {
			select {
			case err := <-done:
				ended = true
				if !errors.Is(err, iptables.ErrNoWatch) {
					t.Fatalf("WatchWrites on iptables-legacy = %v, want ErrNoWatch", err)
				}
			case <-time.After(time.Second):
				t.Fatal("WatchWrites on iptables-legacy did not return at once")
			}
			iptables.Age(e.p, iptables.RecheckEvery)
			intact("recheckEvery after the last full check", true)
			return
		}

		signalled := func(after string) {
			t.Helper()
			select {
			case <-written:
			case <-time.After(5 * time.Second):
				t.Fatalf("no signal within 5s of %s", after)
			}
		}
		signalled("the start of the watch")
		select {
		case <-written:
			t.Fatal("a signal while nothing was written")
		case <-time.After(300 * time.Millisecond):
		}
		iptables.Age(e.p, iptables.RecheckEvery)
		intact("recheckEvery after the last full check, watched", false)

		if _, err := e.node.Run("nft", "add", "table", "ip", "someone-else"); err != nil {
			t.Fatal(err)
		}
		signalled("nft add table ip someone-else")
		intact("after a foreign table", true)

		e.iptables("-t", "nat", "-F", "EP-SERVICES")
		signalled("iptables -t nat -F EP-SERVICES")
		if !tampered() {
			t.Fatal("a flush of EP-SERVICES not seen after its signal")
		}
		e.mustApply(plan)
		signalled("our own repair")
		intact("after the repair (a rewrite: verified by itself)", false)

		if err := end(); err != nil {
			t.Fatalf("WatchWrites = %v after its context ended, want nil", err)
		}
		iptables.Age(e.p, iptables.RecheckEvery)
		intact("recheckEvery after the last full check, the watch ended", true)
	})
}
