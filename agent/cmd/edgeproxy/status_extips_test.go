package main

import (
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/agent"
)

// `edgeproxy status` names the Services whose externalIPs are ignored.
func TestRenderStatusExternalIPsIgnored(t *testing.T) {
	var b strings.Builder
	renderStatus(&b, &agent.Status{Mode: "iptables", ExternalIPsIgnored: []string{"a/x", "b/y"}}, time.Now())
	if !strings.Contains(b.String(), "externalIPs not programmed (externalIPs: false): a/x, b/y\n") {
		t.Errorf("status output:\n%s", b.String())
	}
}
