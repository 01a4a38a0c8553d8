// Command memory is a hostile policy module for the tests: it grows its memory past any cap.
//
// It misbehaves on every call unless its config says {"only": "NS"}, in
// which case it behaves (passes the weights through) except for services
// in namespace NS — so the same module shows both a refusal at check time
// and containment at run time.
package main

import (
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
	grow()
	return nil
}

var hog [][]byte

// grow allocates until the runtime runs out of memory.
func grow() {
	for {
		hog = append(hog, make([]byte, 4<<20))
	}
}

func main() {}
