package kubeproxy_test

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/datapath/kubeproxy"
)

func TestOwned(t *testing.T) {
	for _, c := range []struct {
		table, chain string
		want         bool
	}{
		{"nat", "KUBE-SERVICES", true},
		{"nat", "KUBE-SVC-NPX46M4PTMTKRN6Y", true},
		{"nat", "KUBE-SEP-IT2ZTR26TO4XFPTO", true},
		{"nat", "KUBE-MARK-MASQ", true},
		{"filter", "KUBE-PROXY-FIREWALL", true},
		{"filter", "KUBE-IPVS-FILTER", true},
		{"mangle", "KUBE-PROXY-CANARY", true},
		// kubelet's, never kube-proxy's
		{"filter", "KUBE-FIREWALL", false},
		{"nat", "KUBE-KUBELET-CANARY", false},
		{"mangle", "KUBE-IPTABLES-HINT", false},
		{"nat", "KUBE-MARK-DROP", false},
		{"filter", "KUBE-SVC-NPX46M4PTMTKRN6Y", false}, // service chains live in nat only
		{"nat", "EP-SERVICES", false},
	} {
		if got := kubeproxy.Owned(c.table, c.chain); got != c.want {
			t.Errorf("Owned(%s, %s) = %t, want %t", c.table, c.chain, got, c.want)
		}
	}
}

func TestPlan(t *testing.T) {
	saved, err := os.ReadFile("testdata/kube-proxy.rules")
	if err != nil {
		t.Fatal(err)
	}
	input, rm := kubeproxy.Plan("nat", string(saved))
	// CNI-HOSTPORT-MASQ (not kube-proxy's) jumps to KUBE-MARK-MASQ: that
	// chain is kept; everything else of kube-proxy's goes.
	if !slices.Equal(rm.Kept, []string{"KUBE-MARK-MASQ"}) {
		t.Errorf("kept %v, want [KUBE-MARK-MASQ]", rm.Kept)
	}
	wantChains := []string{"KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-PROXY-CANARY", "KUBE-SEP-IT2ZTR26TO4XFPTO",
		"KUBE-SERVICES", "KUBE-SVC-NPX46M4PTMTKRN6Y", "KUBE-EXT-NPX46M4PTMTKRN6Y"}
	if !slices.Equal(rm.Chains, wantChains) {
		t.Errorf("chains %v, want %v", rm.Chains, wantChains)
	}
	if rm.Jumps != 3 {
		t.Errorf("%d jumps, want 3 (PREROUTING, OUTPUT, POSTROUTING)", rm.Jumps)
	}
	text := string(input)
	for _, want := range []string{
		"-D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n",
		"-D POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n",
		":KUBE-SVC-NPX46M4PTMTKRN6Y - [0:0]\n",
		"-X KUBE-SEP-IT2ZTR26TO4XFPTO\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("input lacks %q:\n%s", want, text)
		}
	}
	for _, never := range []string{"EP-SERVICES", "CNI-HOSTPORT", "KUBE-KUBELET-CANARY", "KUBE-MARK-MASQ"} {
		if strings.Contains(text, never) {
			t.Errorf("input touches %s:\n%s", never, text)
		}
	}
	// Jumps are deleted before the chains are emptied and deleted.
	if d, x := strings.LastIndex(text, "-D "), strings.Index(text, ":"); d > x {
		t.Errorf("a jump is deleted after a chain is emptied:\n%s", text)
	}

	filter, rm := kubeproxy.Plan("filter", string(saved))
	if rm.Jumps != 9 || len(rm.Chains) != 6 || len(rm.Kept) != 0 {
		t.Errorf("filter: %d jumps, chains %v, kept %v; want 9 jumps, 6 chains, none kept", rm.Jumps, rm.Chains, rm.Kept)
	}
	if strings.Contains(string(filter), "KUBE-FIREWALL") {
		t.Errorf("filter input touches kubelet's KUBE-FIREWALL:\n%s", filter)
	}
	if in, rm := kubeproxy.Plan("mangle", "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n"); in != nil || len(rm.Chains) != 0 {
		t.Errorf("mangle with kubelet's chains only: input %q, removal %+v; want none", in, rm)
	}
}
