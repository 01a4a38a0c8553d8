package nftables

import (
	"context"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// TestWatchWrites: the watch signals once it is on, then after a commit
// in the namespace the Proxier programs (here someone else's, by nft),
// and returns nil when its context ends. A commit in another namespace
// is not announced: it is made before the one awaited, and the second
// signal must come from the awaited one (a transaction in our namespace
// that the test makes after draining the first).
func TestWatchWrites(t *testing.T) {
	kernel(t)
	ns, other := netns.New(t, "nftwatch"), netns.New(t, "nftwatch2")
	p := newProxier(t, ns, Options{})
	ctx, cancel := context.WithCancel(t.Context())
	written := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() { done <- p.WatchWrites(ctx, written) }()
	wait := func(what string) {
		t.Helper()
		select {
		case <-written:
		case err := <-done:
			t.Fatalf("the watch ended before %s: %v", what, err)
		case <-time.After(time.Minute):
			t.Fatalf("no signal for %s within a minute", what)
		}
	}
	wait("the start of the watch")
	if _, err := other.Run("nft", "add table inet elsewhere"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-written:
		t.Fatal("a commit in another namespace was announced")
	case <-time.After(200 * time.Millisecond):
	}
	if _, err := ns.Run("nft", "add table inet someone"); err != nil {
		t.Fatal(err)
	}
	wait("nft's commit")
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("WatchWrites after its context ended: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("WatchWrites did not return within a minute of its context's end")
	}
}
