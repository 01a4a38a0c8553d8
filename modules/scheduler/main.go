// Command scheduler is a policy module that picks the IPVS scheduler per
// service port. Weights pass through unchanged.
//
// The annotation (default edgeproxy.io/scheduler) wins: "sh", or with flags
// "sh:sh-port,sh-fallback". Otherwise config rules apply, by port name or
// number, then by protocol:
//
//	ports: {"443": sh, grpc: mh}
//	protocols: {UDP: sh}
//	default: ""        # empty: the node's configured scheduler
package main

import (
	"strconv"
	"strings"

	"github.com/edgeproxy/edgeproxy/modules/sdk"
	"github.com/edgeproxy/edgeproxy/modules/sdk/jsoncfg"
)

var cfg struct {
	Annotation string            `json:"annotation"`
	Ports      map[string]string `json:"ports"`
	Protocols  map[string]string `json:"protocols"`
	Default    string            `json:"default"`
}

func init() { sdk.Run(sdk.Module{Init: jsoncfg.Into(&cfg), Evaluate: evaluate}) }

// set chooses the scheduler written as "name" or "name:flag,flag". A
// spec the ABI would refuse is ignored with a reason, so that a typo in an
// annotation leaves the service on the default scheduler instead of
// failing the chain.
func set(out *sdk.Output, spec, why string) {
	name, flags, _ := strings.Cut(strings.TrimSpace(spec), ":")
	name = strings.TrimSpace(name)
	var fl []string
	for f := range strings.SplitSeq(flags, ",") {
		if f = strings.TrimSpace(f); f != "" {
			fl = append(fl, f)
		}
	}
	check := sdk.Output{Scheduler: name, SchedulerFlags: fl}
	if err := check.Validate(0); err != nil {
		out.Reason = "ignored " + why + ": " + err.Error()
		return
	}
	out.Scheduler, out.SchedulerFlags, out.Reason = name, fl, why
}

func evaluate(in *sdk.Input, out *sdk.Output) error {
	key := cfg.Annotation
	if key == "" {
		key = "edgeproxy.io/scheduler"
	}
	if v, ok := sdk.Lookup(in.Service.Annotations, key); ok && v != "" {
		set(out, v, "annotation "+key)
		return nil
	}
	s := in.Service
	for _, k := range []string{s.PortName, strconv.Itoa(int(s.Port))} {
		if v, ok := cfg.Ports[k]; ok && k != "" {
			set(out, v, "port rule "+k)
			return nil
		}
	}
	if v, ok := cfg.Protocols[s.Protocol]; ok {
		set(out, v, "protocol rule "+s.Protocol)
		return nil
	}
	if cfg.Default != "" {
		set(out, cfg.Default, "default")
		return nil
	}
	out.Reason = "no rule; node default"
	return nil
}

func main() {}
