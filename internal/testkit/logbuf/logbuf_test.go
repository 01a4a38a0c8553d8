package logbuf

import (
	"strings"
	"sync"
	"testing"
)

// Writers running at once lose nothing and never interleave within one
// write (run with -race).
func TestConcurrentWrites(t *testing.T) {
	var b Buffer
	const writers, lines = 8, 200
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for range lines {
				if n, err := b.Write([]byte("line\n")); n != 5 || err != nil {
					t.Errorf("Write: %d, %v", n, err)
				}
			}
		})
	}
	for range lines { // reads while the writers write
		_ = b.String()
	}
	wg.Wait()
	got := b.String()
	if n := strings.Count(got, "line\n"); n != writers*lines || len(got) != 5*writers*lines {
		t.Fatalf("%d whole lines in %d bytes, want %d in %d", n, len(got), writers*lines, 5*writers*lines)
	}
}
