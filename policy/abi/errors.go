package abi

import "strconv"

// The package builds its error messages without fmt: the Go SDK links it
// into every Go module, and fmt (with the reflection it needs) would add
// about a fifth to a module's code, which the host validates at every load.

// wrapError is msg: err, unwrapping to err.
type wrapError struct {
	msg string
	err error
}

func (e *wrapError) Error() string { return e.msg + ": " + e.err.Error() }
func (e *wrapError) Unwrap() error { return e.err }

// truncated returns "msg: abi: truncated", matching ErrTruncated.
func truncated(msg string) error { return &wrapError{msg, ErrTruncated} }

func itoa(n int) string    { return strconv.Itoa(n) }
func u32s(n uint32) string { return strconv.FormatUint(uint64(n), 10) }

// quote32 quotes at most the first 32 runes of s, as fmt's %.32q does.
func quote32(s string) string {
	n := 0
	for i := range s {
		if n == 32 {
			s = s[:i]
			break
		}
		n++
	}
	return strconv.Quote(s)
}
