package sdk

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/edgeproxy/edgeproxy/policy/abi"
)

// TestEvaluateBatch: each input of a batch is answered in order, and an
// input the module fails on (an error, a panic) gets an empty item while
// its batch-mates are answered.
func TestEvaluateBatch(t *testing.T) {
	defer func(m Module) { registered = m }(registered)
	Run(Module{Evaluate: func(in *Input, out *Output) error {
		switch in.Service.Name {
		case "err":
			return errors.New("refused")
		case "panic":
			panic("boom")
		}
		out.Weights[0] = uint32(in.Service.Port)
		return nil
	}})
	names := []string{"a", "err", "b", "panic", "c"}
	b := abi.AppendBatchHeader(nil, len(names))
	for k, name := range names {
		in := &abi.Input{Service: abi.Service{Name: name, Port: uint16(k + 1)},
			Endpoints: []abi.Endpoint{{Addr: netip.MustParseAddr("10.0.0.1"), Weight: 1}}}
		b = abi.AppendBatchItem(b, abi.AppendInput(nil, in))
	}
	res := evaluateBatch(b)
	items, err := abi.SplitBatch(nil, res, len(names))
	if err != nil {
		t.Fatal(err)
	}
	for k, name := range names {
		if name == "err" || name == "panic" {
			if len(items[k]) != 0 {
				t.Errorf("%s: %d bytes, want an empty item", name, len(items[k]))
			}
			continue
		}
		var out abi.Output
		if err := abi.DecodeOutput(items[k], &out); err != nil || len(out.Weights) != 1 || out.Weights[0] != uint32(k+1) {
			t.Errorf("%s: %+v %v, want weight %d", name, out, err, k+1)
		}
	}
	if evaluateBatch([]byte("junk")) != nil {
		t.Error("a batch that does not decode was answered")
	}
}
