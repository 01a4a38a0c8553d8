// Package logbuf is a log sink for tests: the goroutines of the code under
// test write to a Buffer while the test reads what they wrote.
package logbuf

import (
	"strings"
	"sync"
)

// Buffer collects what is written to it. It is safe for concurrent use;
// the zero value is ready.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write appends p; it never fails.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
