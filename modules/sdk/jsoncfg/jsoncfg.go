// Package jsoncfg decodes a policy module's config into a Go struct with
// encoding/json, for modules that prefer struct tags to reading
// sdk.ParseConfig's values:
//
//	func init() { sdk.Run(sdk.Module{Init: jsoncfg.Into(&cfg), Evaluate: evaluate}) }
//
// It costs: encoding/json and the reflection it needs nearly double a
// module's code, which the host validates at every load and whose package
// inits run at every instantiation (modules/README.md, "Cost per call").
package jsoncfg

import (
	"encoding/json"
	"fmt"
)

// Into returns an Init function that decodes the config into v.
func Into(v any) func([]byte) error {
	return func(b []byte) error {
		if err := json.Unmarshal(b, v); err != nil {
			return fmt.Errorf("config: %w", err)
		}
		return nil
	}
}
