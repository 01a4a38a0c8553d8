// Command weighted is a policy module that turns a service annotation into
// endpoint weights, for canaries and uneven zones.
//
// The annotation (default edgeproxy.io/weights) is a comma-separated list
// of rules "kind:match=weight", most specific kind first:
//
//	addr:10.1.2.3=10, addr:10.1.0.0/16=5   # endpoint address or prefix
//	node:edge-7=50, node:canary-*=1        # node name, '*' ends a prefix
//	zone:zone-a=80, zone:zone-b=20
//	default=100                            # everything else
//
// Config (all optional): annotation, default (weight when nothing matches;
// default 100), and zones / nodes maps applied when the annotation does not
// say otherwise. Weights are clamped to the ABI's maximum.
package main

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/edgeproxy/edgeproxy/modules/sdk"
	"github.com/edgeproxy/edgeproxy/modules/sdk/jsoncfg"
)

var cfg = struct {
	Annotation string            `json:"annotation"`
	Default    *uint32           `json:"default"`
	Zones      map[string]uint32 `json:"zones"`
	Nodes      map[string]uint32 `json:"nodes"`
}{}

type rule struct {
	kind, match string
	prefix      netip.Prefix
	weight      uint32
}

func init() { sdk.Run(sdk.Module{Init: jsoncfg.Into(&cfg), Evaluate: evaluate}) }

func parse(s string) ([]rule, error) {
	var rules []rule
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		lhs, ws, ok := strings.Cut(f, "=")
		if !ok {
			return nil, fmt.Errorf("rule %q: missing '='", f)
		}
		w, err := strconv.ParseUint(strings.TrimSpace(ws), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("rule %q: weight: %w", f, err)
		}
		r := rule{weight: uint32(min(w, sdk.MaxWeight))}
		lhs = strings.TrimSpace(lhs)
		if lhs == "default" {
			r.kind = "default"
		} else if r.kind, r.match, ok = strings.Cut(lhs, ":"); !ok {
			return nil, fmt.Errorf("rule %q: want kind:match=weight", f)
		}
		switch r.kind {
		case "default", "zone", "node":
		case "addr":
			if p, err := netip.ParsePrefix(r.match); err == nil {
				r.prefix = p.Masked()
			} else if a, err := netip.ParseAddr(r.match); err == nil {
				r.prefix = netip.PrefixFrom(a, a.BitLen())
			} else {
				return nil, fmt.Errorf("rule %q: bad address", f)
			}
		default:
			return nil, fmt.Errorf("rule %q: unknown kind %q", f, r.kind)
		}
		rules = append(rules, r)
	}
	return rules, nil
}

func matchName(pattern, name string) bool {
	if p, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(name, p)
	}
	return pattern == name
}

// weightOf applies the most specific rule: addr, node, zone, default.
func weightOf(rules []rule, e *sdk.Endpoint, def uint32) (uint32, string) {
	for _, kind := range [...]string{"addr", "node", "zone"} {
		for _, r := range rules {
			if r.kind != kind {
				continue
			}
			if (kind == "addr" && r.prefix.Contains(e.Addr)) ||
				(kind == "node" && matchName(r.match, e.NodeName)) ||
				(kind == "zone" && r.match == e.Zone) {
				return r.weight, kind
			}
		}
		switch kind {
		case "node":
			if w, ok := cfg.Nodes[e.NodeName]; ok {
				return min(w, sdk.MaxWeight), "config"
			}
		case "zone":
			if w, ok := cfg.Zones[e.Zone]; ok {
				return min(w, sdk.MaxWeight), "config"
			}
		}
	}
	for _, r := range rules {
		if r.kind == "default" {
			return r.weight, "default"
		}
	}
	return def, "default"
}

func evaluate(in *sdk.Input, out *sdk.Output) error {
	key := cfg.Annotation
	if key == "" {
		key = "edgeproxy.io/weights"
	}
	def := uint32(100)
	if cfg.Default != nil {
		def = min(*cfg.Default, sdk.MaxWeight)
	}
	val, _ := sdk.Lookup(in.Service.Annotations, key)
	rules, err := parsed(val)
	if err != nil {
		// A typo in an annotation must not break the service: keep the
		// input weights and say why.
		out.Reason = "ignored " + key + ": " + err.Error()
		return nil
	}
	matched := 0
	for i := range in.Endpoints {
		w, by := weightOf(rules, &in.Endpoints[i], def)
		if by != "default" {
			matched++
		}
		out.Weights[i] = w
	}
	out.Reason = reason(matched, len(in.Endpoints))
	return nil
}

// The last annotation parsed, and what it gave: a sync calls the module
// for many service ports with the same annotation, and parsing allocates,
// which is slow in the guest. Input strings stay valid while referenced,
// so keeping val is safe.
var (
	lastVal   string
	lastRules []rule
	lastErr   error
	parsedAny bool
)

func parsed(val string) ([]rule, error) {
	if !parsedAny || !sdk.Equal(val, lastVal) {
		lastRules, lastErr = parse(val)
		lastVal, parsedAny = val, true
	}
	return lastRules, lastErr
}

// reasons caches reason strings for services of up to maxCached endpoints.
const maxCached = 32

var reasons []string // [total*(maxCached+1)+matched]

func reason(matched, total int) string {
	if total > maxCached {
		return makeReason(matched, total)
	}
	if reasons == nil {
		reasons = make([]string, (maxCached+1)*(maxCached+1))
	}
	r := &reasons[total*(maxCached+1)+matched]
	if *r == "" {
		*r = makeReason(matched, total)
	}
	return *r
}

func makeReason(matched, total int) string {
	return strconv.Itoa(matched) + " of " + strconv.Itoa(total) + " endpoints matched a rule"
}

func main() {}
