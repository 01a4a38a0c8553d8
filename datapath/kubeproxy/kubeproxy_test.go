package kubeproxy_test

import (
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/ipset"
	"github.com/edgeproxy/edgeproxy/datapath/ipvs"
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

func TestKubeServers(t *testing.T) {
	a := netip.MustParseAddr
	vs := func(addr string, p datapath.Protocol, port uint16) ipvs.VirtualServer {
		return ipvs.VirtualServer{Addr: a(addr), Protocol: p, Port: port, Scheduler: "rr"}
	}
	all := []ipvs.VirtualServer{
		vs("10.96.0.10", datapath.TCP, 53),      // 0: kube-proxy's ClusterIP, on kube-ipvs0
		vs("10.96.0.10", datapath.UDP, 53),      // 1: the same, adopted by edgeproxy (keep)
		vs("203.0.113.7", datapath.TCP, 80),     // 2: an externalIP on kube-ipvs0
		vs("fd00:96::1", datapath.TCP, 443),     // 3: an IPv6 ClusterIP on kube-ipvs0
		vs("192.168.1.5", datapath.TCP, 30080),  // 4: a NodePort on a node address
		vs("192.168.1.5", datapath.UDP, 30080),  // 5: UDP 30080 is no NodePort: a user's
		vs("192.168.1.5", datapath.TCP, 30081),  // 6: a NodePort edgeproxy programs (keep)
		vs("192.168.1.100", datapath.TCP, 80),   // 7: keepalived's VIP on a node link, port no NodePort
		vs("198.51.100.1", datapath.TCP, 30080), // 8: a NodePort's port, not on a node address
		vs("192.168.1.5", datapath.SCTP, 30090), // 9: an SCTP NodePort (hash set of address,port)
		vs("192.168.1.6", datapath.SCTP, 30090), // 10: the same port on an address not in the set
	}
	link := map[netip.Addr]bool{a("10.96.0.10"): true, a("203.0.113.7"): true, a("fd00:96::1"): true}
	node := map[netip.Addr]bool{a("192.168.1.5"): true, a("192.168.1.6"): true, a("192.168.1.100"): true}
	np := kubeproxy.NodePorts{
		Ports: map[datapath.Protocol]map[uint16]bool{datapath.TCP: {30080: true, 30081: true}},
		SCTP:  map[netip.AddrPort]bool{netip.MustParseAddrPort("192.168.1.5:30090"): true},
	}
	keep := func(k ipvs.Key) bool { return k == all[1].Key() || k == all[6].Key() }
	got := kubeproxy.KubeServers(all, link, node, np, keep)
	want := []ipvs.VirtualServer{all[0], all[2], all[3], all[4], all[9]}
	if !slices.Equal(got, want) {
		t.Errorf("KubeServers:\n got %v\nwant %v", got, want)
	}
	// Without kube-proxy's link and sets nothing is kube-proxy's.
	if got := kubeproxy.KubeServers(all, nil, node, kubeproxy.NodePorts{}, nil); len(got) != 0 {
		t.Errorf("without kube-ipvs0 and sets: %v, want none", got)
	}
	// Without keep, the adopted ones are kube-proxy's too.
	if got := kubeproxy.KubeServers(all, link, node, np, nil); len(got) != 7 {
		t.Errorf("without keep: %d virtual servers %v, want 7", len(got), got)
	}
}

func TestKubeSetNames(t *testing.T) {
	names := kubeproxy.KubeSetNames()
	for _, want := range []string{"KUBE-CLUSTER-IP", "KUBE-6-CLUSTER-IP", "KUBE-LOOP-BACK", "KUBE-NODE-PORT-TCP", "KUBE-6-NODE-PORT-LOCAL-UDP", "KUBE-IPVS-IPS", "KUBE-6-HEALTH-CHECK-NODE-PORT",
		"KUBE-6-LOAD-BALANCER-SOURCE-CID", "KUBE-6-NODE-PORT-LOCAL-SCTP-HAS"} {
		if !slices.Contains(names, want) {
			t.Errorf("KubeSetNames lacks %s", want)
		}
	}
	for _, n := range names {
		if !strings.HasPrefix(n, "KUBE-") || strings.HasPrefix(n, "EP-") || len(n) > ipset.MaxNameLen {
			t.Errorf("set name %q: not kube-proxy's or too long", n)
		}
	}
	if len(names) != 34 {
		t.Errorf("%d names, want 17 per family", len(names))
	}
}
