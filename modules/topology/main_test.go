package main

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/edgeproxy/edgeproxy/modules/sdk"
)

func input(eps ...sdk.Endpoint) *sdk.Input {
	for i := range eps {
		eps[i].Addr = netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)})
		eps[i].Weight = 1
	}
	return &sdk.Input{Node: sdk.Node{Name: "n1", Zone: "eu-1a", Region: "eu-1"}, Endpoints: eps}
}

func TestLevels(t *testing.T) {
	cases := []struct {
		name   string
		config string
		in     *sdk.Input
		want   []uint32
	}{
		{"node first", `{}`, input(sdk.Endpoint{NodeName: "n1", Zone: "eu-1a"}, sdk.Endpoint{NodeName: "n2", Zone: "eu-1a"}), []uint32{1, 0}},
		{"zone next", `{}`, input(sdk.Endpoint{NodeName: "n2", Zone: "eu-1b"}, sdk.Endpoint{NodeName: "n3", Zone: "eu-1a"}), []uint32{0, 1}},
		{"region by prefix", `{}`, input(sdk.Endpoint{Zone: "us-1a"}, sdk.Endpoint{Zone: "eu-1c"}), []uint32{0, 1}},
		{"region by map", `{"regions":{"far":"eu-1"}}`, input(sdk.Endpoint{Zone: "us-1a"}, sdk.Endpoint{Zone: "far"}), []uint32{0, 1}},
		{"anything", `{}`, input(sdk.Endpoint{Zone: "us-1a"}, sdk.Endpoint{Zone: "ap-1a"}), []uint32{1, 1}},
		{"minEndpoints widens", `{"minEndpoints":2}`, input(sdk.Endpoint{NodeName: "n1", Zone: "eu-1a"}, sdk.Endpoint{NodeName: "n2", Zone: "eu-1a"}, sdk.Endpoint{Zone: "us-1a"}), []uint32{1, 1, 0}},
		{"levels", `{"levels":["zone","any"]}`, input(sdk.Endpoint{NodeName: "n1", Zone: "eu-1a"}, sdk.Endpoint{NodeName: "n2", Zone: "eu-1a"}, sdk.Endpoint{NodeName: "n3", Zone: "eu-1b"}), []uint32{1, 1, 0}},
		{"no zone is anywhere", `{}`, input(sdk.Endpoint{NodeName: "n2"}, sdk.Endpoint{NodeName: "n3", Zone: "us-1a"}), []uint32{1, 1}},
	}
	for _, c := range cases {
		out, err := sdk.Call([]byte(c.config), c.in)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !slices.Equal(out.Weights, c.want) {
			t.Errorf("%s: %v (%s), want %v", c.name, out.Weights, out.Reason, c.want)
		}
	}
	if _, err := sdk.Call([]byte(`{"levels":["planet"]}`), input()); err == nil {
		t.Error("unknown level accepted")
	}
}
