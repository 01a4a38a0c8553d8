package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/agent/planner"
	"github.com/edgeproxy/edgeproxy/agent/state"
	"github.com/edgeproxy/edgeproxy/modules/modbuild"
)

// fill puts n services of 10 endpoints each, over three zones, into a state.
func fill(n int) *state.State {
	st := state.New(nil)
	zones := []string{"zone-a", "zone-b", "zone-c"}
	for i := range n {
		name := fmt.Sprint("svc-", i)
		vip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		st.SetService("shop/"+name, &model.Service{Namespace: "shop", Name: name, ClusterIPs: []netip.Addr{vip},
			Ports: []model.ServicePort{{Name: "http", Protocol: "TCP", Port: 80}}})
		sl := &model.EndpointSlice{Namespace: "shop", Name: name + "-1", Service: name, Family: model.IPv4,
			Ports: []model.EndpointPort{{Name: "http", Protocol: "TCP", Port: 8080}}}
		for j := range 10 {
			sl.Endpoints = append(sl.Endpoints, model.Endpoint{
				Addr: netip.AddrFrom4([4]byte{10, 244, byte(i >> 4), byte(16*(i&15) + j)}), Ready: true, Serving: true,
				NodeName: fmt.Sprint("edge-", j), Zone: zones[j%3],
			})
		}
		st.SetSlice("shop/"+name+"-1", sl)
	}
	return st
}

// BenchmarkFullSync5k computes the plan for 5,000 service ports × 10
// endpoints from scratch (what a sync costs after a node change): with
// built-in selection only, and with a one-module chain (topology) on every
// port — "chain-cold" with every module input new, "chain-resync" with the
// inputs of the previous sync (answered from the chain's cache); the Go
// module, and the Rust one ("-rust"). The planner hands the chain every
// port at once, so the module is called in batches. ns/op is one whole
// computation; the datapath apply comes on top and is the same for all.
func BenchmarkFullSync5k(b *testing.B) {
	ctx := context.Background()
	st := fill(5000)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	chainPolicy := func(dir string) *chainPolicy {
		mod := filepath.Join(b.TempDir(), "topology.wasm")
		if err := os.WriteFile(mod, modbuild.Build(b, dir), 0o644); err != nil {
			b.Fatal(err)
		}
		cfg := config.Default()
		cfg.StateDir = b.TempDir()
		cfg.Policy.Modules = []config.Module{{Name: "topology", Path: mod}}
		cfg.Policy.Chains = []config.Chain{{Name: "near", Match: config.Match{Namespaces: []string{"shop"}},
			Modules: []config.ChainStep{{Module: "topology"}}, Failure: config.FailureKeepBuiltin}}
		cp, err := newChainPolicy(ctx, &cfg, quiet, prometheus.NewRegistry())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cp.Close(ctx) })
		return cp
	}
	cp, rust := chainPolicy("modules/topology"), chainPolicy("modules/rust/topology")

	// Each iteration moves the node to a new zone: every port is computed
	// again, and every module input is new.
	moveNode := func(i int) *state.Snapshot {
		st.SetNode(&model.Node{Name: "edge-0", Zone: fmt.Sprint("zone-", i)})
		return st.Snapshot()
	}
	run := func(b *testing.B, pol planner.Policy, cold bool) {
		p := planner.New(planner.Options{}, pol)
		p.Build(ctx, moveNode(-1))
		i := 0
		var ru0 syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
		defer func() {
			// CPU time as well as wall time: on a shared machine it is the
			// steadier of the two.
			var ru syscall.Rusage
			syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
			cpu := ru.Utime.Nano() + ru.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano()
			b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
		}()
		for b.Loop() {
			if cold {
				i++
				p.Build(ctx, moveNode(i))
			} else {
				p.Invalidate()
				p.Build(ctx, st.Snapshot())
			}
		}
	}
	b.Run("builtin", func(b *testing.B) { run(b, nil, true) })
	b.Run("chain-cold", func(b *testing.B) { run(b, cp, true) })
	b.Run("builtin-resync", func(b *testing.B) { run(b, nil, false) })
	b.Run("chain-resync", func(b *testing.B) { run(b, cp, false) })
	b.Run("chain-cold-rust", func(b *testing.B) { run(b, rust, true) })
}
