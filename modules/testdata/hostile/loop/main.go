// Command loop is a hostile policy module for the tests: it never returns.
// It misbehaves as package misbehave says (all calls, or those of one namespace).
package main

import (
	"github.com/edgeproxy/edgeproxy/modules/sdk"
	"github.com/edgeproxy/edgeproxy/modules/testdata/hostile/misbehave"
)

func init() { misbehave.Run(evaluate) }

func evaluate(_ *sdk.Input, _ *sdk.Output) {
	spin()
}

var sink int

// spin never returns.
func spin() {
	for i := 0; ; i++ {
		sink = i
	}
}

func main() {}
