package runner_test

import (
	"context"
	"fmt"
	"time"

	"github.com/edgeproxy/edgeproxy/agent/runner"
)

// A sync function driven by the runner: requests coalesce, failures are
// retried, and a run happens at least every maxInterval.
func Example() {
	synced := make(chan struct{}, 1)
	syncOnce := func(ctx context.Context) error {
		// compute the plan, hand it to the datapath ...
		synced <- struct{}{}
		return nil
	}
	r := runner.New("sync", syncOnce, time.Second, 5*time.Second, 30*time.Second, runner.RealClock{})

	// Informer handlers call Run; these three requests are served by one run.
	r.Run()
	r.Run()
	r.Run()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Loop(ctx)
	}()
	<-synced
	cancel()
	<-done

	s := r.Status()
	fmt.Println("runs:", s.Runs, "error:", s.LastError, "pending:", !s.PendingSince.IsZero())
	// Output:
	// runs: 1 error: <nil> pending: false
}
