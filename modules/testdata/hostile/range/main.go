// Command range is a hostile policy module for the tests: it returns a weight above the ABI maximum.
// It misbehaves as package misbehave says (all calls, or those of one namespace).
package main

import (
	"github.com/edgeproxy/edgeproxy/modules/sdk"
	"github.com/edgeproxy/edgeproxy/modules/testdata/hostile/misbehave"
)

func init() { misbehave.Run(evaluate) }

func evaluate(_ *sdk.Input, out *sdk.Output) {
	for i := range out.Weights {
		out.Weights[i] = sdk.MaxWeight + 1
	}
}

func main() {}
