// Command trap is a hostile policy module for the tests: it crashes the Go runtime (a stack overflow), which traps.
//
// It misbehaves on every call unless its config says {"only": "NS"}, in
// which case it behaves (passes the weights through) except for services
// in namespace NS — so the same module shows both a refusal at check time
// and containment at run time.
package main

import (
	"runtime/debug"

	"github.com/edgeproxy/edgeproxy/modules/sdk"
)

var cfg struct {
	Only string `json:"only"`
}

func init() { sdk.Run(sdk.Module{Init: sdk.JSON(&cfg), Evaluate: evaluate}) }

func evaluate(in *sdk.Input, out *sdk.Output) error {
	if cfg.Only != "" && in.Service.Namespace != cfg.Only {
		return nil
	}
	debug.SetMaxStack(64 << 10)
	sink = recurse(1)
	return nil
}

var sink int

func recurse(n int) int {
	var pad [64]byte
	pad[n%64] = byte(n)
	return recurse(n+1) + int(pad[0])
}

func main() {}
