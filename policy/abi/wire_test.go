package abi_test

import (
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/policy/abi"
)

func sample() *abi.Input {
	return &abi.Input{
		Service: abi.Service{
			Namespace: "shop", Name: "web", PortName: "https", Protocol: "TCP", Port: 443,
			Labels:      []abi.KV{{Key: "edgeproxy.io/tier", Value: "front"}},
			Annotations: []abi.KV{{Key: "edgeproxy.io/weights", Value: "zone:a=1"}, {Key: "edgeproxy.io/x", Value: ""}},
		},
		Node: abi.Node{Name: "n1", Zone: "a", Region: "eu", Labels: []abi.KV{{Key: "site", Value: "berlin"}}},
		Endpoints: []abi.Endpoint{
			{Addr: netip.MustParseAddr("10.0.0.1"), Port: 8443, NodeName: "n1", Zone: "a", Ready: true, Serving: true, Local: true, HintZones: []string{"a"}, Weight: 1},
			{Addr: netip.MustParseAddr("fd00::2"), Port: 8443, NodeName: "n2", Zone: "b", Serving: true, Terminating: true, HintZones: []string{"a", "b"}, HintNodes: []string{"n1"}, Weight: abi.MaxWeight},
			{Addr: netip.MustParseAddr("10.0.0.3"), Port: 8443, Weight: 7},
		},
	}
}

func TestInputRoundTrip(t *testing.T) {
	in := sample()
	b := abi.AppendInput(nil, in)
	var got abi.Input
	if err := abi.DecodeInput(b, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&got, in) {
		t.Fatalf("DecodeInput:\n got %+v\nwant %+v", got, *in)
	}
	var d abi.Decoder
	var aliased abi.Input
	if err := d.DecodeInput(b, &aliased); err != nil {
		t.Fatal(err)
	}
	for i := range b { // the decoder keeps its own copy
		b[i] = 0xff
	}
	if !reflect.DeepEqual(&aliased, in) {
		t.Fatalf("Decoder:\n got %+v\nwant %+v", aliased, *in)
	}
	// Decoding into a used value leaves nothing behind.
	if err := abi.DecodeInput(abi.AppendInput(nil, &abi.Input{}), &got); err != nil || len(got.Endpoints) != 0 || got.Service.Labels != nil {
		t.Fatalf("reuse: %+v %v", got, err)
	}
}

func TestDecodeRejectsBrokenInput(t *testing.T) {
	b := abi.AppendInput(nil, sample())
	for n := range len(b) {
		var in abi.Input
		if err := abi.DecodeInput(b[:n], &in); err == nil {
			t.Fatalf("prefix of %d of %d bytes decoded", n, len(b))
		}
	}
	var in abi.Input
	if err := abi.DecodeInput(append(b, 0), &in); err == nil || !strings.Contains(err.Error(), "trailing") {
		t.Fatalf("trailing byte: %v", err)
	}
	bad := append([]byte{2, 0, 0, 0}, b[4:]...)
	if err := abi.DecodeInput(bad, &in); err == nil || !strings.Contains(err.Error(), "version 2") {
		t.Fatalf("version 2: %v", err)
	}
}

func TestOutputValidate(t *testing.T) {
	ok := abi.Output{Weights: []uint32{0, 5, abi.MaxWeight}, Scheduler: "sh", SchedulerFlags: []string{"sh-port"}, Reason: "fine"}
	var got abi.Output
	if err := abi.DecodeOutput(abi.AppendOutput(nil, &ok), &got); err != nil || !reflect.DeepEqual(got, ok) {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	if err := ok.Validate(3); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		out  abi.Output
		n    int
		want string
	}{
		{"short", abi.Output{Weights: []uint32{1}}, 2, "1 weights for 2 endpoints"},
		{"long", abi.Output{Weights: []uint32{1, 1, 1}}, 2, "3 weights for 2 endpoints"},
		{"range", abi.Output{Weights: []uint32{abi.MaxWeight + 1}}, 1, "above the maximum"},
		{"scheduler", abi.Output{Weights: []uint32{1}, Scheduler: "random"}, 1, "unknown scheduler"},
		{"flag", abi.Output{Weights: []uint32{1}, Scheduler: "rr", SchedulerFlags: []string{"sh-port"}}, 1, "does not take flag"},
		{"dup flag", abi.Output{Weights: []uint32{1}, Scheduler: "sh", SchedulerFlags: []string{"sh-port", "sh-port"}}, 1, "repeated"},
		{"orphan flag", abi.Output{Weights: []uint32{1}, SchedulerFlags: []string{"sh-port"}}, 1, "without a scheduler"},
		{"reason", abi.Output{Weights: []uint32{1}, Reason: strings.Repeat("x", 300)}, 1, "reason of 300 bytes"},
		{"utf8", abi.Output{Weights: []uint32{1}, Reason: "\xff"}, 1, "not UTF-8"},
	}
	for _, c := range cases {
		if err := c.out.Validate(c.n); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	if !(&abi.Output{Weights: []uint32{0, 0}}).AllZero() || (&abi.Output{}).AllZero() || (&abi.Output{Weights: []uint32{0, 1}}).AllZero() {
		t.Error("AllZero")
	}
	b := abi.AppendOutput(nil, &ok)
	for n := range len(b) {
		if err := abi.DecodeOutput(b[:n], &got); err == nil {
			t.Fatalf("output prefix of %d bytes decoded", n)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(abi.AppendInput(nil, sample()))
	f.Add(abi.AppendOutput(nil, &abi.Output{Weights: []uint32{1, 2}, Scheduler: "mh"}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var in abi.Input
		if abi.DecodeInput(b, &in) == nil {
			// Unknown flag bits are ignored, so bytes need not round-trip;
			// values must.
			var again abi.Input
			if err := abi.DecodeInput(abi.AppendInput(nil, &in), &again); err != nil || !reflect.DeepEqual(again, in) {
				t.Fatalf("input does not round-trip: %v", err)
			}
		}
		// The guest's fast decoder accepts exactly what DecodeInput
		// accepts, with the same values, also into a used Input.
		var d abi.Decoder
		fast, slow := sample(), sample()
		err := d.DecodeInput(b, fast)
		if (err == nil) != (abi.DecodeInput(b, slow) == nil) {
			t.Fatalf("Decoder and DecodeInput disagree: %v", err)
		}
		if err == nil && !reflect.DeepEqual(fast, slow) {
			t.Fatalf("Decoder:\n got %+v\nwant %+v", *fast, *slow)
		}
		var out abi.Output
		_ = abi.DecodeOutput(b, &out)
	})
}

// BenchmarkDecodeInput compares, on the build machine, the two decoders
// and JSON for a 10-endpoint input (the guest numbers are in
// policy.BenchmarkGuestDecode and RATIONALE.md).
func BenchmarkDecodeInput(b *testing.B) {
	in := sample()
	in.Endpoints = nil
	for i := range 10 {
		in.Endpoints = append(in.Endpoints, abi.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 1, 0, byte(i)}), Port: 8080, NodeName: fmt.Sprint("edge-", i), Zone: "zone-a", Ready: true, Serving: true, HintZones: []string{"zone-a"}, Weight: 1})
	}
	buf := abi.AppendInput(nil, in)
	var out abi.Input
	b.Run("copy", func(b *testing.B) {
		for b.Loop() {
			abi.DecodeInput(buf, &out)
		}
	})
	b.Run("aliasing", func(b *testing.B) {
		var d abi.Decoder
		for b.Loop() {
			d.DecodeInput(buf, &out)
		}
	})
}

func ExampleAppendInput() {
	in := abi.Input{
		Service:   abi.Service{Namespace: "shop", Name: "web", Protocol: "TCP", Port: 80},
		Node:      abi.Node{Name: "n1", Zone: "a"},
		Endpoints: []abi.Endpoint{{Addr: netip.MustParseAddr("10.0.0.1"), Port: 8080, Zone: "a", Ready: true, Serving: true, Weight: 1}},
	}
	b := abi.AppendInput(nil, &in)
	var back abi.Input
	err := abi.DecodeInput(b, &back)
	fmt.Println(len(b), "bytes;", back.Endpoints[0].Addr, err)
	// Output: 64 bytes; 10.0.0.1 <nil>
}
