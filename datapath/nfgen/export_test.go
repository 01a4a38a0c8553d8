package nfgen

// Answer exposes the reply reader to the tests.
var Answer = answer

// Overruns is how many times a watch found its buffer overrun (ENOBUFS).
func Overruns() uint64 { return overruns.Load() }
