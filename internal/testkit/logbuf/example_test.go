package logbuf_test

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/edgeproxy/edgeproxy/internal/testkit/logbuf"
)

// A logger that several goroutines share writes into one Buffer, which
// the test then reads.
func Example() {
	var logs logbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{} // a stable output for the example
			}
			return a
		},
	}))
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() { log.Info("synced", "worker", i) })
	}
	wg.Wait()
	fmt.Println(strings.Count(logs.String(), "msg=synced"))
	// Output: 3
}
