// Package misbehave is what the hostile test modules share: each registers
// the one bad thing it does, and this package decides when it does it.
package misbehave

import (
	"github.com/edgeproxy/edgeproxy/modules/sdk"
	"github.com/edgeproxy/edgeproxy/modules/sdk/jsoncfg"
)

// Run registers a module that does bad on every call, unless its config says
// {"only": "NS"}: then it does bad only for services in namespace NS and
// passes the weights through for the rest — so one module shows both a
// refusal at check time and containment at run time.
func Run(bad func(in *sdk.Input, out *sdk.Output)) {
	var cfg struct {
		Only string `json:"only"`
	}
	sdk.Run(sdk.Module{Init: jsoncfg.Into(&cfg), Evaluate: func(in *sdk.Input, out *sdk.Output) error {
		if cfg.Only == "" || in.Service.Namespace == cfg.Only {
			bad(in, out)
		}
		return nil
	}})
}
