// Command nondeterministic is a hostile policy module for the tests: its output changes from call to call for the same input.
// It misbehaves as package misbehave says (all calls, or those of one namespace).
package main

import (
	"github.com/edgeproxy/edgeproxy/modules/sdk"
	"github.com/edgeproxy/edgeproxy/modules/testdata/hostile/misbehave"
)

func init() { misbehave.Run(evaluate) }

func evaluate(_ *sdk.Input, out *sdk.Output) {
	calls++
	for i := range out.Weights {
		out.Weights[i] = uint32(calls%7 + 1)
	}
}

var calls int

func main() {}
