package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/modules/sdk"
)

func TestScheduler(t *testing.T) {
	conf := `{"ports":{"443":"sh","grpc":"mh:mh-port"},"protocols":{"UDP":"sh:sh-fallback"}}`
	cases := []struct {
		name  string
		svc   sdk.Service
		sched string
		flags []string
	}{
		{"annotation wins", sdk.Service{Port: 443, Annotations: []sdk.KV{{Key: "edgeproxy.io/scheduler", Value: "lc"}}}, "lc", nil},
		{"port number", sdk.Service{Port: 443, Protocol: "TCP"}, "sh", nil},
		{"port name", sdk.Service{Port: 9000, PortName: "grpc", Protocol: "TCP"}, "mh", []string{"mh-port"}},
		{"protocol", sdk.Service{Port: 53, Protocol: "UDP"}, "sh", []string{"sh-fallback"}},
		{"none", sdk.Service{Port: 80, Protocol: "TCP"}, "", nil},
	}
	for _, c := range cases {
		cfg.Ports, cfg.Protocols = nil, nil
		in := &sdk.Input{Service: c.svc, Endpoints: []sdk.Endpoint{{Weight: 3}, {Weight: 9}}}
		out, err := sdk.Call([]byte(conf), in)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if out.Scheduler != c.sched || !slices.Equal(out.SchedulerFlags, c.flags) || !slices.Equal(out.Weights, []uint32{3, 9}) {
			t.Errorf("%s: %q %v %v", c.name, out.Scheduler, out.SchedulerFlags, out.Weights)
		}
	}
	out, err := sdk.Call(nil, &sdk.Input{Service: sdk.Service{Annotations: []sdk.KV{{Key: "edgeproxy.io/scheduler", Value: "fastest"}}}})
	if err != nil || out.Scheduler != "" || !strings.Contains(out.Reason, "ignored") {
		t.Errorf("unknown scheduler in an annotation: %q %q %v", out.Scheduler, out.Reason, err)
	}
}
