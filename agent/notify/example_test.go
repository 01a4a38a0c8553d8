package notify_test

import (
	"context"
	"errors"
	"log/slog"

	"github.com/edgeproxy/edgeproxy/agent/notify"
)

// The agent's wiring: Run owns the watchdog goroutine; the sync loop reports
// every attempt and marks readiness after its first successful programming.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n, err := notify.New(notify.Options{Logger: slog.Default()})
	if err != nil {
		panic(err)
	}
	go n.Run(ctx) // returns nil when ctx ends

	_ = n.Status("waiting for the API server")
	sync := func() error { return errors.New("apiserver unreachable") } // one attempt
	for range 3 {
		err := sync()
		n.Progress() // success or not: the loop is alive
		if err == nil && !n.Ready() {
			_ = n.MarkReady("programmed from the API")
		}
	}
}
