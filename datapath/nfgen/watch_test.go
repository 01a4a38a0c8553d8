package nfgen_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath/nfgen"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

const (
	signalWait = 5 * time.Second        // for a signal that must come
	quietWait  = 300 * time.Millisecond // for one that must not
)

// watch runs Watch in ns until the test ends (or stop is called) and
// returns its channel; stop cancels it and returns what Watch returned.
func watch(t *testing.T, ns *netns.NS) (changed chan struct{}, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	changed = make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() { done <- ns.Do(func() error { return nfgen.Watch(ctx, changed) }) }()
	var err error
	stopped := false
	stop = func() error {
		if !stopped {
			cancel()
			err, stopped = <-done, true
		}
		return err
	}
	t.Cleanup(func() { _ = stop() })
	// The first signal says the watch is subscribed.
	signalled(t, changed, "the subscription")
	return changed, stop
}

func signalled(t *testing.T, changed <-chan struct{}, after string) {
	t.Helper()
	select {
	case <-changed:
	case <-time.After(signalWait):
		t.Fatalf("no signal within %v of %s", signalWait, after)
	}
}

func quiet(t *testing.T, changed <-chan struct{}, while string) {
	t.Helper()
	select {
	case <-changed:
		t.Fatalf("a signal while %s", while)
	case <-time.After(quietWait):
	}
}

func nft(t *testing.T, ns *netns.NS, args ...string) {
	t.Helper()
	if _, err := ns.Run("nft", args...); err != nil {
		t.Fatal(err)
	}
}

// A commit in the watched namespace is announced; nothing is while nothing
// is committed, nor when another namespace commits.
func TestWatchSignalsCommits(t *testing.T) {
	gate.Root(t)
	gate.Binaries(t, "nft")
	ns, other := netns.New(t, "watch"), netns.New(t, "other")
	changed, _ := watch(t, ns)
	quiet(t, changed, "nothing was committed")
	nft(t, ns, "add", "table", "ip", "t1")
	signalled(t, changed, "nft add table ip t1")
	quiet(t, changed, "nothing was committed after one commit")
	nft(t, other, "add", "table", "ip", "t2")
	quiet(t, changed, "only another namespace committed")
	nft(t, ns, "add", "chain", "ip", "t1", "c")
	signalled(t, changed, "nft add chain ip t1 c")
}

// A commit of thousands of rules overruns the watch's small buffer: that
// is a signal, not an error, and the watch goes on. The watch reads nothing
// until the commit is done: a reader that keeps pace (it can, on an idle
// core, or when the writer is preempted mid-commit) would see no overrun.
func TestWatchOverrun(t *testing.T) {
	gate.Root(t)
	gate.Binaries(t, "nft")
	ns := netns.New(t, "overrun")
	release, restore := nfgen.HoldReads()
	changed, stop := watch(t, ns)
	t.Cleanup(func() { release(); _ = stop(); restore() })
	var b strings.Builder
	b.WriteString("add table ip big\nadd chain ip big c\n")
	for i := range 5000 {
		fmt.Fprintf(&b, "add rule ip big c tcp dport %d accept\n", 1+i)
	}
	file := filepath.Join(t.TempDir(), "big.nft")
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	before := nfgen.Overruns()
	nft(t, ns, "-f", file)
	release()
	signalled(t, changed, "a commit of 5,000 rules")
	if nfgen.Overruns() == before {
		t.Fatal("a commit of 5,000 rules did not overrun the watch's buffer: the test no longer covers overruns")
	}
	// Still watching.
	quiet(t, changed, "nothing was committed after the overrun")
	nft(t, ns, "add", "chain", "ip", "big", "d")
	signalled(t, changed, "a commit after the overrun")
	if err := stop(); err != nil {
		t.Fatalf("Watch = %v after an overrun, want nil", err)
	}
}

// Watch returns nil promptly once its context is done, also when nothing
// is committed that would wake it.
func TestWatchCancel(t *testing.T) {
	gate.Root(t)
	ns := netns.New(t, "cancel")
	_, stop := watch(t, ns)
	start := time.Now()
	if err := stop(); err != nil {
		t.Fatalf("Watch = %v after cancel, want nil", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Watch took %v to return after cancel", d)
	}
}

// A watch runs in a goroutine of its own, which must be in the namespace
// to watch (here, the process's); the loop that consumes its signals reads
// the generation or checks the rules after each.
func ExampleWatch() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	changed := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() { done <- nfgen.Watch(ctx, changed) }()
	for {
		select {
		case <-changed:
			g, err := nfgen.Current()
			fmt.Println("generation", g, err)
		case err := <-done:
			fmt.Println("watch ended:", err) // poll from now on
			return
		}
	}
}
