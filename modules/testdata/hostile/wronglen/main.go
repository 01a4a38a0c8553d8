// Command wronglen is a hostile policy module for the tests: it returns one weight more than there are endpoints.
// It misbehaves as package misbehave says (all calls, or those of one namespace).
package main

import (
	"github.com/edgeproxy/edgeproxy/modules/sdk"
	"github.com/edgeproxy/edgeproxy/modules/testdata/hostile/misbehave"
)

func init() { misbehave.Run(evaluate) }

func evaluate(_ *sdk.Input, out *sdk.Output) {
	out.Weights = append(out.Weights, 1)
}

func main() {}
