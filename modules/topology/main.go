// Command topology is a policy module that keeps traffic close: it prefers
// endpoints on this node, then in this zone, then in this region, then
// anywhere, moving to a wider level only while the narrower one has fewer
// than minEndpoints endpoints.
//
// Config (all optional):
//
//	minEndpoints: 2          # default 1
//	levels: [node, zone, region, any]   # default; drop a level to skip it
//	regions: {zone-a: eu-1}  # zone -> region; otherwise a zone belongs to
//	                         # the node's region when it starts with its name
package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/edgeproxy/edgeproxy/modules/sdk"
)

var cfg struct {
	MinEndpoints int               `json:"minEndpoints"`
	Levels       []string          `json:"levels"`
	Regions      map[string]string `json:"regions"`
}

func init() {
	sdk.Run(sdk.Module{Init: initConfig, Evaluate: evaluate})
}

func initConfig(b []byte) error {
	if err := sdk.JSON(&cfg)(b); err != nil {
		return err
	}
	if cfg.MinEndpoints < 1 {
		cfg.MinEndpoints = 1
	}
	if len(cfg.Levels) == 0 {
		cfg.Levels = []string{"node", "zone", "region", "any"}
	}
	for _, l := range cfg.Levels {
		switch l {
		case "node", "zone", "region", "any":
		default:
			return fmt.Errorf("topology: unknown level %q", l)
		}
	}
	return nil
}

func region(in *sdk.Input, zone string) string {
	if r, ok := cfg.Regions[zone]; ok {
		return r
	}
	if in.Node.Region != "" && strings.HasPrefix(zone, in.Node.Region) {
		return in.Node.Region
	}
	return ""
}

func inLevel(in *sdk.Input, e *sdk.Endpoint, level string) bool {
	switch level {
	case "node":
		return e.Local || (e.NodeName != "" && e.NodeName == in.Node.Name)
	case "zone":
		return e.Zone != "" && e.Zone == in.Node.Zone
	case "region":
		r := in.Node.Region
		if r == "" {
			r = region(in, in.Node.Zone)
		}
		return r != "" && e.Zone != "" && region(in, e.Zone) == r
	}
	return true
}

func evaluate(in *sdk.Input, out *sdk.Output) error {
	if len(in.Endpoints) == 0 {
		out.Reason = "no endpoints"
		return nil
	}
	for _, level := range cfg.Levels {
		n := 0
		for i := range in.Endpoints {
			if inLevel(in, &in.Endpoints[i], level) {
				n++
			}
		}
		if n < cfg.MinEndpoints && level != "any" {
			continue
		}
		if n == 0 {
			continue
		}
		for i := range in.Endpoints {
			if !inLevel(in, &in.Endpoints[i], level) {
				out.Weights[i] = 0
			}
		}
		out.Reason = level + ": " + strconv.Itoa(n) + " of " + strconv.Itoa(len(in.Endpoints)) + " endpoints"
		return nil
	}
	out.Reason = "no level matched; all endpoints kept"
	return nil
}

func main() {}
