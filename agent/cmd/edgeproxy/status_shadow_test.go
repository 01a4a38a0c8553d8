package main

import (
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/agent"
	"github.com/edgeproxy/edgeproxy/agent/policychain"
)

// `edgeproxy status` says how many calls of a shadow the shadow budget
// skipped (issue 29 §7: shadowBudget: 1ns skipped every shadow with only a
// metric to say so), and says nothing of it when none was.
func TestRenderStatusShadowSkipped(t *testing.T) {
	var b strings.Builder
	renderStatus(&b, &agent.Status{Mode: "plan", Modules: []policychain.ModuleStatus{
		{Chain: "c", Module: "weighted"},
		{Chain: "c", Module: "next", ShadowOf: "weighted", Skipped: 12},
		{Chain: "c", Module: "other", ShadowOf: "weighted"},
	}}, time.Now())
	out := b.String()
	if !strings.Contains(out, "next (shadow of weighted)   ok, 12 skipped (policy.shadowBudget spent)") {
		t.Errorf("status output without the skipped shadow calls:\n%s", out)
	}
	if strings.Count(out, "skipped") != 1 {
		t.Errorf("status output mentions skips of a shadow that had none:\n%s", out)
	}
}
