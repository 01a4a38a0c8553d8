package policy

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/edgeproxy/edgeproxy/policy/abi"
)

// ProbeInput is a golden input every module is called with before it is
// trusted.
type ProbeInput struct {
	Name  string
	Input abi.Input
}

// ProbeInputs returns the golden inputs: no endpoints, one endpoint, many
// endpoints over zones and nodes, and mixed conditions (not ready,
// terminating, IPv6, hints, missing zone).
func ProbeInputs() []ProbeInput {
	svc := abi.Service{
		Namespace: "edgeproxy-probe", Name: "probe", PortName: "http", Protocol: "TCP", Port: 80,
		Labels:      []abi.KV{{Key: "edgeproxy.io/app", Value: "probe"}},
		Annotations: []abi.KV{{Key: "edgeproxy.io/note", Value: "golden input"}},
	}
	node := abi.Node{Name: "node-0", Zone: "zone-a", Region: "region-1", Labels: []abi.KV{{Key: "edgeproxy.io/tier", Value: "edge"}}}
	ep := func(i int, zone string) abi.Endpoint {
		n := fmt.Sprintf("node-%d", i%8)
		return abi.Endpoint{
			Addr: netip.AddrFrom4([4]byte{10, 0, byte(i / 250), byte(1 + i%250)}), Port: 8080,
			NodeName: n, Zone: zone, Ready: true, Serving: true, Local: n == node.Name, Weight: 1,
		}
	}
	zones := []string{"zone-a", "zone-b", "zone-c", "region-2-zone-a"}
	var many []abi.Endpoint
	for i := range 64 {
		many = append(many, ep(i, zones[i%len(zones)]))
	}
	mixed := []abi.Endpoint{
		ep(0, "zone-a"),
		{Addr: netip.MustParseAddr("10.0.9.2"), Port: 8080, NodeName: "node-1", Zone: "zone-b", Serving: true, Terminating: true, Weight: 1},
		{Addr: netip.MustParseAddr("10.0.9.3"), Port: 8080, NodeName: "node-2", Zone: "zone-a", Weight: 7},
		{Addr: netip.MustParseAddr("fd00::5"), Port: 8443, NodeName: "node-3", Zone: "zone-c", Ready: true, Serving: true, HintZones: []string{"zone-a", "zone-c"}, HintNodes: []string{"node-0"}, Weight: abi.MaxWeight},
		{Addr: netip.MustParseAddr("10.0.9.5"), Port: 8080, Ready: true, Serving: true, Weight: 1},
	}
	return []ProbeInput{
		{"empty", abi.Input{Service: svc, Node: node}},
		{"one", abi.Input{Service: svc, Node: node, Endpoints: many[:1]}},
		{"many", abi.Input{Service: svc, Node: node, Endpoints: many}},
		{"mixed", abi.Input{Service: svc, Node: node, Endpoints: mixed}},
	}
}

func probeCheckNames() []string {
	var names []string
	for _, p := range ProbeInputs() {
		names = append(names, "probe:"+p.Name)
	}
	return append(names, "deterministic", "batch")
}

// probe calls inst on every golden input twice: each output must validate,
// and the second round must repeat the first byte for byte.
func (h *Host) probe(ctx context.Context, inst *Instance, r *Report) bool {
	inputs := ProbeInputs()
	first := make([][]byte, len(inputs))
	ok := true
	for i, p := range inputs {
		out, _, ce := inst.invoke(ctx, h.opts.ProbeTimeout, &p.Input, false)
		var err error
		if ce != nil {
			err = ce
		}
		detail := ""
		if err == nil {
			first[i] = abi.AppendOutput(nil, &out)
			detail = fmt.Sprintf("%d endpoints -> valid output", len(p.Input.Endpoints))
			if out.Scheduler != "" {
				detail += ", scheduler " + out.Scheduler
			}
			if out.Reason != "" {
				detail += fmt.Sprintf(", reason %.60q", out.Reason)
			}
		}
		if !r.add("probe:"+p.Name, err, detail) {
			ok = false
			if inst.mod == nil { // trapped or timed out: the instance is gone
				for _, q := range inputs[i+1:] {
					r.skip("not run: the instance failed", "probe:"+q.Name)
				}
				r.skip("not run: the instance failed", "deterministic", "batch")
				return false
			}
		}
	}
	if !ok {
		r.skip("not run: a probe failed", "deterministic", "batch")
		return false
	}
	for i, p := range inputs {
		out, _, ce := inst.invoke(ctx, h.opts.ProbeTimeout, &p.Input, false)
		if ce != nil {
			err := error(ce)
			r.add("deterministic", fmt.Errorf("second call on %s failed: %w", p.Name, err), "")
			r.skip("not run: a probe failed", "batch")
			return false
		}
		if !bytes.Equal(abi.AppendOutput(nil, &out), first[i]) {
			r.add("deterministic", fmt.Errorf("second call on %s returned a different output", p.Name), "")
			r.skip("not run: a probe failed", "batch")
			return false
		}
	}
	r.add("deterministic", nil, fmt.Sprintf("%d inputs, same outputs on a second call", len(inputs)))
	return h.probeBatch(ctx, inst, r, inputs, first)
}

// probeBatch calls ep_evaluate_batch, when the module exports it, on all
// golden inputs at once: the batch must decode and answer each input with
// the bytes ep_evaluate gave. A module whose batch disagrees with itself
// is refused.
func (h *Host) probeBatch(ctx context.Context, inst *Instance, r *Report, inputs []ProbeInput, first [][]byte) bool {
	if inst.batch == nil {
		r.skip("no "+abi.BatchExport+" export (ABI 1.0): one call per service port", "batch")
		return true
	}
	frame := abi.AppendBatchHeader(nil, len(inputs))
	limit := uint32(8)
	for _, p := range inputs {
		frame = abi.AppendBatchItem(frame, abi.AppendInput(nil, &p.Input))
		limit += 4 + maxOutput(len(p.Input.Endpoints))
	}
	err := func() error {
		if ce := inst.call(ctx, h.opts.ProbeTimeout*time.Duration(len(inputs)), inst.batch, frame, limit, len(inputs)); ce != nil {
			if ce.Reason == ReasonTrap || ce.Reason == ReasonTimeout {
				inst.discard(ctx)
			}
			return ce
		}
		items, err := abi.SplitBatch(nil, inst.out, len(inputs))
		if err != nil {
			return err
		}
		for k, p := range inputs {
			out, ce := inst.checkOutput(items[k], len(p.Input.Endpoints), false)
			if ce != nil {
				return fmt.Errorf("%s: %w", p.Name, ce)
			}
			if !bytes.Equal(abi.AppendOutput(nil, &out), first[k]) {
				return fmt.Errorf("%s: the batch answered differently from %s", p.Name, abi.EvaluateExport)
			}
		}
		return nil
	}()
	return r.add("batch", err, fmt.Sprintf("%s answers %d inputs in one call as %s does one by one", abi.BatchExport, len(inputs), abi.EvaluateExport))
}
