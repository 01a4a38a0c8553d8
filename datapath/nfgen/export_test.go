package nfgen

import (
	"sync"
	"syscall"
)

// Answer exposes the reply reader to the tests, from the reply's bytes.
func Answer(b []byte, seq uint32) (uint32, error) {
	msgs, err := syscall.ParseNetlinkMessage(b)
	if err != nil {
		return 0, err
	}
	return answer(msgs, seq)
}

// HoldReads makes every Watch started after it wait, before it reads
// events, until release is called; the returned restore undoes it once
// those watches have ended.
func HoldReads() (release, restore func()) {
	held := make(chan struct{})
	var once sync.Once
	beforeRead = func() { <-held }
	return func() { once.Do(func() { close(held) }) }, func() { beforeRead = nil }
}
