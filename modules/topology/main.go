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
	"errors"
	"slices"
	"strconv"

	"github.com/edgeproxy/edgeproxy/modules/sdk"
)

// The config, read by initConfig.
var cfg struct {
	minEndpoints int
	levels       []int             // resolved, narrowest first
	regions      map[string]string // zone -> region
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

// initConfig reads the config with the SDK's small JSON reader (not
// encoding/json, which would double the module's code and its start-up),
// resolving level names at init so that a call compares no strings to
// find a level. A repeated key keeps its last value, as in encoding/json.
func initConfig(b []byte) error {
	v, err := sdk.ParseConfig(b)
	if err != nil {
		return errors.New("config: " + err.Error())
	}
	if v.Kind != sdk.Object {
		return errors.New("config: not a JSON object")
	}
	cfg.minEndpoints, cfg.levels, cfg.regions = 1, nil, nil
	if m, ok := v.Field("minEndpoints"); ok {
		n, ok := m.Int()
		if !ok {
			return errors.New("config: minEndpoints is not an integer")
		}
		cfg.minEndpoints = int(max(n, 1))
	}
	if ls, ok := v.Field("levels"); ok {
		if ls.Kind != sdk.Array {
			return errors.New("config: levels is not a list")
		}
		for _, l := range ls.Items {
			name, ok := l.Str()
			if !ok {
				return errors.New("config: a level is not a string")
			}
			i := slices.Index(levelNames[:], name)
			if i < 0 {
				return errors.New("topology: unknown level " + strconv.Quote(name))
			}
			cfg.levels = append(cfg.levels, i)
		}
	}
	if len(cfg.levels) == 0 {
		cfg.levels = []int{levelNode, levelZone, levelRegion, levelAny}
	}
	if rs, ok := v.Field("regions"); ok {
		if rs.Kind != sdk.Object {
			return errors.New("config: regions is not an object")
		}
		cfg.regions = make(map[string]string, len(rs.Keys))
		for k, zone := range rs.Keys {
			r, ok := rs.Items[k].Str()
			if !ok {
				return errors.New("config: a region is not a string")
			}
			cfg.regions[zone] = r
		}
	}
	return nil
}

// region returns the region of zone. Comparisons use sdk.Equal: this runs
// per endpoint, where == costs a byte loop inside the guest.
func region(in *sdk.Input, zone string) string {
	if len(cfg.regions) > 0 {
		if r, ok := cfg.regions[zone]; ok {
			return r
		}
	}
	if in.Node.Region != "" && sdk.HasPrefix(zone, in.Node.Region) {
		return in.Node.Region
	}
	return ""
}

// closest returns the narrowest level an endpoint shares with this node.
func closest(in *sdk.Input, e *sdk.Endpoint, nodeRegion string) int {
	switch {
	case e.Local || (e.NodeName != "" && sdk.Equal(e.NodeName, in.Node.Name)):
		return levelNode
	case e.Zone == "":
		return levelAny
	case sdk.Equal(e.Zone, in.Node.Zone):
		return levelZone
	case nodeRegion != "" && sdk.Equal(region(in, e.Zone), nodeRegion):
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
	var at [levelAny + 1]int
	for i := range in.Endpoints {
		r := closest(in, &in.Endpoints[i], nodeRegion)
		ranks = append(ranks, r)
		at[r]++
	}
	within := at
	for l := levelZone; l <= levelAny; l++ {
		within[l] += within[l-1]
	}
	for _, l := range cfg.levels {
		n := within[l]
		if n == 0 || (n < cfg.minEndpoints && l != levelAny) {
			continue
		}
		for i, r := range ranks {
			if r > l {
				out.Weights[i] = 0
			}
		}
		out.Reason = reason(l, n, len(in.Endpoints))
		return nil
	}
	out.Reason = "no level matched; all endpoints kept"
	return nil
}

// reasons caches reason strings for services of up to maxCached
// endpoints, so that a call does not build (and allocate) the same string
// again: allocating is slow in a guest, and garbage makes the guest's
// collector run.
const maxCached = 32

var reasons [levelAny + 1][]string // [level][total*(maxCached+1)+n]

func reason(l, n, total int) string {
	if total > maxCached {
		return makeReason(l, n, total)
	}
	if reasons[l] == nil {
		reasons[l] = make([]string, (maxCached+1)*(maxCached+1))
	}
	r := &reasons[l][total*(maxCached+1)+n]
	if *r == "" {
		*r = makeReason(l, n, total)
	}
	return *r
}

func makeReason(l, n, total int) string {
	return levelNames[l] + ": " + strconv.Itoa(n) + " of " + strconv.Itoa(total) + " endpoints"
}

func main() {}
