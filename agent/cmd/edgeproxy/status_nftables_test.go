package main

import (
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/agent"
	"github.com/edgeproxy/edgeproxy/datapath/nftables"
)

// `edgeproxy status` in nftables mode shows the last apply and the
// tables; a table never written is left out, and so is an apply that
// never happened; other tables' drop policies are warned of.
func TestRenderStatusNFTables(t *testing.T) {
	now := time.Now()
	var b strings.Builder
	renderStatus(&b, &agent.Status{Mode: "nftables", NFTables: &nftables.Status{
		LastApply: nftables.Stats{Units: 3, Messages: 17, Bytes: 5120, Duration: 2500 * time.Microsecond, At: now.Add(-5 * time.Second)},
		Tables:    []nftables.TableStatus{{Family: "ip", Written: true, Tables: 17, Chains: 21, ServicePorts: 4}, {Family: "ip6"}},
		Warnings:  []string{"table ip filter chain FORWARD (forward, priority 0) has policy drop: …"},
	}}, now)
	for _, want := range []string{
		"nftables: last apply 5s ago: partial, 3 service ports compared, 17 netlink operations (5120 bytes), 2.5ms\n",
		"nftables tables: ip family: 17 tables, 21 chains, 4 service ports\n",
		"nftables warning: table ip filter chain FORWARD (forward, priority 0) has policy drop: …\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status output lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	renderStatus(&b, &agent.Status{Mode: "nftables", NFTables: &nftables.Status{Tables: []nftables.TableStatus{{Family: "ip"}}}}, now)
	if strings.Contains(b.String(), "nftables") && !strings.Contains(b.String(), "mode nftables") || strings.Count(b.String(), "nftables") != 1 {
		t.Errorf("status before any apply:\n%s", b.String())
	}
}
