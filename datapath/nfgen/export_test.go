package nfgen

import "sync"

// Answer exposes the reply reader to the tests.
var Answer = answer

// HoldReads makes every Watch started after it wait, before it reads
// events, until release is called; the returned restore undoes it once
// those watches have ended.
func HoldReads() (release, restore func()) {
	held := make(chan struct{})
	var once sync.Once
	beforeRead = func() { <-held }
	return func() { once.Do(func() { close(held) }) }, func() { beforeRead = nil }
}
