// Package poll waits in tests for a condition that another process or the
// kernel makes true: the one loop the test tiers share.
package poll

import (
	"testing"
	"time"
)

// Every is how often Until asks.
const Every = 200 * time.Millisecond

// Until asks fn every Every until it returns nil, for at most d; then the
// test fails with what and fn's last error.
func Until(t testing.TB, d time.Duration, what string, fn func() error) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(Every) {
		if err = fn(); err == nil {
			return
		}
	}
	t.Fatalf("%s: not within %s: %v", what, d, err)
}
