// Command trap is a hostile policy module for the tests: it crashes the Go runtime (a stack overflow), which traps.
// It misbehaves as package misbehave says (all calls, or those of one namespace).
package main

import (
	"runtime/debug"

	"github.com/edgeproxy/edgeproxy/modules/sdk"
	"github.com/edgeproxy/edgeproxy/modules/testdata/hostile/misbehave"
)

func init() { misbehave.Run(evaluate) }

func evaluate(_ *sdk.Input, _ *sdk.Output) {
	debug.SetMaxStack(64 << 10)
	sink = recurse(1)
}

var sink int

func recurse(n int) int {
	var pad [64]byte
	pad[n%64] = byte(n)
	return recurse(n+1) + int(pad[0])
}

func main() {}
