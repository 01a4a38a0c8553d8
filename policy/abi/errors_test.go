package abi

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestErrorsLikeFmt: the messages built without fmt read as fmt would
// have written them, and truncation still matches ErrTruncated.
func TestErrorsLikeFmt(t *testing.T) {
	for _, s := range []string{"", "wrr", strings.Repeat("x", 40), strings.Repeat("é", 40), "a\"b\n\xff", strings.Repeat("日本", 20)} {
		if got, want := quote32(s), fmt.Sprintf("%.32q", s); got != want {
			t.Errorf("quote32(%q) = %s, want %s", s, got, want)
		}
	}
	err := truncated("abi: batch item 3")
	if !errors.Is(err, ErrTruncated) || err.Error() != fmt.Errorf("abi: batch item %d: %w", 3, ErrTruncated).Error() {
		t.Errorf("truncated: %v", err)
	}
	if got, want := u32s(1<<32-1), "4294967295"; got != want {
		t.Errorf("u32s = %s, want %s", got, want)
	}
}
