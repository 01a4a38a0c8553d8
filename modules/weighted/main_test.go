package main

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/modules/sdk"
)

func TestWeights(t *testing.T) {
	eps := []sdk.Endpoint{
		{Addr: netip.MustParseAddr("10.0.0.1"), NodeName: "edge-1", Zone: "a", Weight: 1},
		{Addr: netip.MustParseAddr("10.0.1.2"), NodeName: "canary-7", Zone: "a", Weight: 1},
		{Addr: netip.MustParseAddr("10.0.2.3"), NodeName: "edge-3", Zone: "b", Weight: 1},
		{Addr: netip.MustParseAddr("10.0.3.4"), NodeName: "edge-4", Zone: "c", Weight: 1},
	}
	cases := []struct {
		name, config, annotation string
		want                     []uint32
	}{
		{"defaults", `{}`, "", []uint32{100, 100, 100, 100}},
		{"zones", `{}`, "zone:a=80,zone:b=20", []uint32{80, 80, 20, 100}},
		{"canary prefix", `{}`, "zone:a=80, node:canary-*=1, default=5", []uint32{80, 1, 5, 5}},
		{"addr beats node", `{}`, "addr:10.0.1.0/24=3, node:canary-*=1", []uint32{100, 3, 100, 100}},
		{"config maps", `{"default":7,"zones":{"c":9},"nodes":{"edge-3":4}}`, "", []uint32{7, 7, 4, 9}},
		{"clamped", `{}`, "zone:a=99999", []uint32{sdk.MaxWeight, sdk.MaxWeight, 100, 100}},
		{"zero drops", `{}`, "zone:b=0", []uint32{100, 100, 0, 100}},
	}
	for _, c := range cases {
		cfg.Annotation, cfg.Default, cfg.Zones, cfg.Nodes = "", nil, nil, nil
		in := &sdk.Input{Endpoints: slices.Clone(eps), Service: sdk.Service{Annotations: []sdk.KV{{Key: "edgeproxy.io/weights", Value: c.annotation}}}}
		out, err := sdk.Call([]byte(c.config), in)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !slices.Equal(out.Weights, c.want) {
			t.Errorf("%s: %v, want %v", c.name, out.Weights, c.want)
		}
	}
	// A broken annotation keeps the input weights and says why.
	in := &sdk.Input{Endpoints: slices.Clone(eps), Service: sdk.Service{Annotations: []sdk.KV{{Key: "edgeproxy.io/weights", Value: "zone:a=lots"}}}}
	out, err := sdk.Call(nil, in)
	if err != nil || !slices.Equal(out.Weights, []uint32{1, 1, 1, 1}) || !strings.Contains(out.Reason, "ignored") {
		t.Fatalf("bad annotation: %v %q %v", out.Weights, out.Reason, err)
	}
}
