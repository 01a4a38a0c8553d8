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
	"slices"
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

// Levels, narrowest first.
const (
	levelNode = iota
	levelZone
	levelRegion
	levelAny
)

var levelNames = [...]string{"node", "zone", "region", "any"}

// levels is cfg.Levels resolved at init, so that a call compares no
// strings to find a level.
var levels []int

func initConfig(b []byte) error {
	if err := sdk.JSON(&cfg)(b); err != nil {
		return err
	}
	if cfg.MinEndpoints < 1 {
		cfg.MinEndpoints = 1
	}
	if len(cfg.Levels) == 0 {
		cfg.Levels = slices.Clone(levelNames[:])
	}
	levels = levels[:0]
	for _, l := range cfg.Levels {
		i := slices.Index(levelNames[:], l)
		if i < 0 {
			return fmt.Errorf("topology: unknown level %q", l)
		}
		levels = append(levels, i)
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

// closest returns the narrowest level an endpoint shares with this node.
func closest(in *sdk.Input, e *sdk.Endpoint, nodeRegion string) int {
	switch {
	case e.Local || (e.NodeName != "" && e.NodeName == in.Node.Name):
		return levelNode
	case e.Zone == "":
		return levelAny
	case e.Zone == in.Node.Zone:
		return levelZone
	case nodeRegion != "" && region(in, e.Zone) == nodeRegion:
		return levelRegion
	}
	return levelAny
}

var ranks []int // per endpoint, reused

func evaluate(in *sdk.Input, out *sdk.Output) error {
	if len(in.Endpoints) == 0 {
		out.Reason = "no endpoints"
		return nil
	}
	nodeRegion := in.Node.Region
	if nodeRegion == "" {
		nodeRegion = region(in, in.Node.Zone)
	}
	// One pass: each endpoint's closest level, and how many endpoints are
	// within each level (an endpoint in this zone is also in this region).
	ranks = ranks[:0]
	var within [levelAny + 1]int
	for i := range in.Endpoints {
		r := closest(in, &in.Endpoints[i], nodeRegion)
		ranks = append(ranks, r)
		for l := r; l <= levelAny; l++ {
			within[l]++
		}
	}
	for _, l := range levels {
		n := within[l]
		if n == 0 || (n < cfg.MinEndpoints && l != levelAny) {
			continue
		}
		for i, r := range ranks {
			if r > l {
				out.Weights[i] = 0
			}
		}
		out.Reason = levelNames[l] + ": " + strconv.Itoa(n) + " of " + strconv.Itoa(len(in.Endpoints)) + " endpoints"
		return nil
	}
	out.Reason = "no level matched; all endpoints kept"
	return nil
}

func main() {}
