// Command memory is a hostile policy module for the tests: it grows its memory past any cap.
// It misbehaves as package misbehave says (all calls, or those of one namespace).
package main

import (
	"github.com/edgeproxy/edgeproxy/modules/sdk"
	"github.com/edgeproxy/edgeproxy/modules/testdata/hostile/misbehave"
)

func init() { misbehave.Run(evaluate) }

func evaluate(_ *sdk.Input, _ *sdk.Output) {
	grow()
}

var hog [][]byte

// grow allocates until the runtime runs out of memory.
func grow() {
	for {
		hog = append(hog, make([]byte, 4<<20))
	}
}

func main() {}
