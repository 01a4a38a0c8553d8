package iptables

import (
	"flag"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

func ep(s string, w uint32, local bool) datapath.Endpoint {
	return datapath.Endpoint{Addr: netip.MustParseAddrPort(s), Weight: w, Local: local}
}

// samplePlan covers every kind of frontend and option the renderer knows.
func samplePlan() []datapath.Frontend {
	a := netip.MustParseAddr
	fs := []datapath.Frontend{
		{Service: datapath.ServicePortName{Namespace: "default", Name: "web", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: a("10.96.0.10"), Family: datapath.IPv4, Port: 80,
			Endpoints: []datapath.Endpoint{ep("10.244.0.2:8080", 3, true), ep("10.244.0.3:8080", 1, true)}},
		{Service: datapath.ServicePortName{Namespace: "default", Name: "web", Port: "http"}, Kind: datapath.NodePort, Protocol: datapath.TCP, Family: datapath.IPv4, Port: 30080,
			Endpoints: []datapath.Endpoint{ep("10.244.0.2:8080", 3, true), ep("10.244.0.3:8080", 1, true)}},
		{Service: datapath.ServicePortName{Namespace: "default", Name: "web", Port: "http"}, Kind: datapath.ExternalIP, Protocol: datapath.TCP, Addr: a("172.30.0.5"), Family: datapath.IPv4, Port: 80,
			Endpoints: []datapath.Endpoint{ep("10.244.0.2:8080", 3, true), ep("10.244.0.3:8080", 1, true)}},
		{Service: datapath.ServicePortName{Namespace: "default", Name: "dns", Port: "dns"}, Kind: datapath.ClusterIP, Protocol: datapath.UDP, Addr: a("10.96.0.53"), Family: datapath.IPv4, Port: 53,
			Endpoints: []datapath.Endpoint{ep("10.244.0.4:5353", 1, true), ep("10.244.0.5:5353", 1, false), ep("10.244.0.6:5353", 1, false)}},
		{Service: datapath.ServicePortName{Namespace: "default", Name: "dns", Port: "dns-tcp"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: a("10.96.0.53"), Family: datapath.IPv4, Port: 53,
			Endpoints: []datapath.Endpoint{ep("10.244.0.4:5353", 1, true)}},
		{Service: datapath.ServicePortName{Namespace: "default", Name: "sticky"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: a("10.96.0.20"), Family: datapath.IPv4, Port: 8080,
			Affinity: 3 * time.Hour, Endpoints: []datapath.Endpoint{ep("10.244.0.2:8080", 1, true), ep("10.244.0.3:8080", 1, true)}},
		{Service: datapath.ServicePortName{Namespace: "default", Name: "empty"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: a("10.96.0.30"), Family: datapath.IPv4, Port: 80},
		{Service: datapath.ServicePortName{Namespace: "default", Name: "empty"}, Kind: datapath.NodePort, Protocol: datapath.TCP, Family: datapath.IPv4, Port: 30030},
		{Service: datapath.ServicePortName{Namespace: "edge", Name: "lb", Port: "https"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: a("10.96.1.1"), Family: datapath.IPv4, Port: 443,
			Endpoints: []datapath.Endpoint{ep("10.244.0.2:8443", 1, true), ep("10.244.1.2:8443", 1, false)}},
		{Service: datapath.ServicePortName{Namespace: "edge", Name: "lb", Port: "https"}, Kind: datapath.LoadBalancer, Protocol: datapath.TCP, Addr: a("172.30.0.100"), Family: datapath.IPv4, Port: 443, LocalOnly: true,
			SourceRanges: []netip.Prefix{netip.MustParsePrefix("192.168.77.0/24")},
			Endpoints:    []datapath.Endpoint{ep("10.244.0.2:8443", 1, true)},
			Cluster:      []datapath.Endpoint{ep("10.244.0.2:8443", 1, true), ep("10.244.1.2:8443", 1, false)}},
		{Service: datapath.ServicePortName{Namespace: "edge", Name: "lb", Port: "https"}, Kind: datapath.NodePort, Protocol: datapath.TCP, Family: datapath.IPv4, Port: 30443, LocalOnly: true,
			Endpoints: []datapath.Endpoint{ep("10.244.0.2:8443", 1, true)},
			Cluster:   []datapath.Endpoint{ep("10.244.0.2:8443", 1, true), ep("10.244.1.2:8443", 1, false)}},
		// Both traffic policies Local: the ClusterIP has the local set, the
		// short-circuit still uses the cluster-wide one.
		{Service: datapath.ServicePortName{Namespace: "edge", Name: "both"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: a("10.96.1.5"), Family: datapath.IPv4, Port: 80,
			Endpoints: []datapath.Endpoint{ep("10.244.0.7:80", 1, true)}},
		{Service: datapath.ServicePortName{Namespace: "edge", Name: "both"}, Kind: datapath.NodePort, Protocol: datapath.TCP, Family: datapath.IPv4, Port: 30005, LocalOnly: true,
			Endpoints: []datapath.Endpoint{ep("10.244.0.7:80", 1, true)},
			Cluster:   []datapath.Endpoint{ep("10.244.0.7:80", 1, true), ep("10.244.1.7:80", 1, false)}},
		{Service: datapath.ServicePortName{Namespace: "edge", Name: "remote"}, Kind: datapath.ClusterIP, Protocol: datapath.SCTP, Addr: a("10.96.1.2"), Family: datapath.IPv4, Port: 9000,
			Endpoints: []datapath.Endpoint{ep("10.244.1.3:9000", 1, false)}},
		{Service: datapath.ServicePortName{Namespace: "edge", Name: "remote"}, Kind: datapath.NodePort, Protocol: datapath.SCTP, Family: datapath.IPv4, Port: 30900, LocalOnly: true, Drop: true,
			Cluster: []datapath.Endpoint{ep("10.244.1.3:9000", 1, false)}},
		// internalTrafficPolicy Local without local endpoints: dropped;
		// externalTrafficPolicy Local without any endpoint: refused.
		{Service: datapath.ServicePortName{Namespace: "edge", Name: "itp"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: a("10.96.1.3"), Family: datapath.IPv4, Port: 80, Drop: true},
		{Service: datapath.ServicePortName{Namespace: "edge", Name: "gone"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: a("10.96.1.4"), Family: datapath.IPv4, Port: 80},
		{Service: datapath.ServicePortName{Namespace: "edge", Name: "gone"}, Kind: datapath.LoadBalancer, Protocol: datapath.TCP, Addr: a("172.30.0.104"), Family: datapath.IPv4, Port: 80, LocalOnly: true},
		// Another family: ignored by an IPv4 ruleset.
		{Service: datapath.ServicePortName{Namespace: "default", Name: "v6"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: a("fd00::10"), Family: datapath.IPv6, Port: 80,
			Endpoints: []datapath.Endpoint{ep("[fd00:244::2]:8080", 1, true)}},
	}
	p := datapath.Plan{Frontends: fs}
	p.Sort()
	return p.Frontends
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if string(want) != got {
		wl, gl := strings.Split(string(want), "\n"), strings.Split(got, "\n")
		for i := 0; i < max(len(wl), len(gl)); i++ {
			var w, g string
			if i < len(wl) {
				w = wl[i]
			}
			if i < len(gl) {
				g = gl[i]
			}
			if w != g {
				t.Fatalf("%s differs first at line %d:\nwant: %s\ngot:  %s\n(run go test -update if the change is intended)", path, i+1, w, g)
			}
		}
	}
}

func TestRenderGolden(t *testing.T) {
	cidr := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"default", Config{Family: datapath.IPv4, MasqueradeBit: 14, ClusterCIDRs: cidr, LocalhostNodePorts: true, RandomFully: true, HealthCheckPorts: []uint16{32000}}},
		{"masquerade-all", Config{Family: datapath.IPv4, MasqueradeBit: 14, MasqueradeAll: true}},
		{"nodeport-addresses", Config{Family: datapath.IPv4, MasqueradeBit: 3, ClusterCIDRs: cidr,
			NodePortIPs: []netip.Addr{netip.MustParseAddr("192.168.77.1"), netip.MustParseAddr("10.0.0.1")}}},
		{"ipv6", Config{Family: datapath.IPv6, MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:244::/64")}}},
		// detectLocalMode BridgeInterface and InterfaceNamePrefix: pods
		// told by the interface (the cluster range is then not used).
		{"detect-bridge", Config{Family: datapath.IPv4, MasqueradeBit: 14, ClusterCIDRs: cidr, PodInterface: "cni0"}},
		{"detect-prefix-ipv6", Config{Family: datapath.IPv6, MasqueradeBit: 14, PodInterface: "veth+"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := Render(tc.cfg, samplePlan())
			if len(rs.Errors) > 0 {
				t.Fatalf("render errors: %v", rs.Errors)
			}
			text, err := rs.RestoreText()
			if err != nil {
				t.Fatal(err)
			}
			golden(t, tc.name, text)
		})
	}
}

func TestChainName(t *testing.T) {
	seen := map[string]string{}
	for i := range 20000 {
		id := "ns/svc-" + strings.Repeat("x", i%300) + ":" + string(rune('a'+i%26)) + string(rune(i))
		for _, kind := range []string{kindSvc, kindSep, kindExt, kindFw} {
			n := ChainName(kind, id)
			if len(n) > MaxChainLen {
				t.Fatalf("ChainName(%q, ...) = %q: %d chars, more than %d", kind, n, len(n), MaxChainLen)
			}
			if !ours(n) {
				t.Fatalf("%q lacks prefix %q", n, Prefix)
			}
			if strings.Trim(n, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567-") != "" {
				t.Fatalf("%q has characters outside [A-Z2-7-]", n)
			}
			if prev, dup := seen[n]; dup && prev != kind+id {
				t.Fatalf("collision: %q for %q and %q", n, prev, kind+id)
			}
			seen[n] = kind + id
		}
	}
	if ChainName(kindSvc, "a") != ChainName(kindSvc, "a") {
		t.Fatal("ChainName is not stable")
	}
	for _, c := range slices.Concat(fixedChains[xtables.NAT], fixedChains[xtables.Filter]) {
		if len(c) > MaxChainLen || !ours(c) {
			t.Errorf("fixed chain %q: too long or without prefix", c)
		}
	}
}

// TestWeights checks that the cascade of statistic rules gives each
// endpoint the share of its weight: rule i is reached with the product of
// the misses before it.
func TestWeights(t *testing.T) {
	for _, ws := range [][]uint32{{1}, {1, 1}, {3, 1}, {1, 1, 1, 1}, {10000, 1, 5, 7}, {2, 3, 5}} {
		var eps []datapath.Endpoint
		var sum float64
		for i, w := range ws {
			eps = append(eps, datapath.Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)}), 80), Weight: w})
			sum += float64(w)
		}
		fs := []datapath.Frontend{{Service: datapath.ServicePortName{Namespace: "a", Name: "b", Port: "c"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: netip.MustParseAddr("10.96.0.1"), Family: datapath.IPv4, Port: 80, Endpoints: eps}}
		rs := Render(Config{Family: datapath.IPv4, MasqueradeBit: 14}, fs)
		svc := rs.units[0].chains[0]
		if len(svc.rules) != len(ws) {
			t.Fatalf("weights %v: %d rules in SVC chain, want %d", ws, len(svc.rules), len(ws))
		}
		reach := 1.0
		for i, r := range svc.rules {
			p := 1.0
			if f := r.Args(); slices.Contains(f, "--probability") {
				var err error
				p, err = parseFloat(f[slices.Index(f, "--probability")+1])
				if err != nil {
					t.Fatal(err)
				}
			}
			got := reach * p
			if want := float64(ws[i]) / sum; math.Abs(got-want) > 1e-9 {
				t.Errorf("weights %v: endpoint %d gets %.10f, want %.10f", ws, i, got, want)
			}
			reach *= 1 - p
		}
	}
}

// TestPartialWrite checks what a partial restore contains: the fixed
// chains, the chains of changed units only, and stale chains flushed and
// deleted.
func TestPartialWrite(t *testing.T) {
	cfg := Config{Family: datapath.IPv4, MasqueradeBit: 14}
	before := Render(cfg, samplePlan())
	fs := samplePlan()
	for i := range fs {
		if fs[i].Service == (datapath.ServicePortName{Namespace: "default", Name: "sticky"}) {
			fs[i].Endpoints = fs[i].Endpoints[:1]
		}
	}
	after := Render(cfg, fs)
	changed := map[unitID]bool{}
	old := map[unitID]digest{}
	for _, u := range before.units {
		old[u.id] = u.digest
	}
	for _, u := range after.units {
		if old[u.id] != u.digest {
			changed[u.id] = true
		}
	}
	if len(changed) != 1 || !changed[unitID{datapath.ServicePortName{Namespace: "default", Name: "sticky"}, datapath.TCP}] {
		t.Fatalf("changed units = %v, want only default/sticky tcp", changed)
	}
	var stale []xtables.Chain
	now := after.chains()
	for c := range before.chains() {
		if _, ok := now[c]; !ok {
			stale = append(stale, c)
		}
	}
	if len(stale) != 1 {
		t.Fatalf("stale chains = %v, want the SEP chain of the removed endpoint", stale)
	}
	_, _, fixed, err := before.restoreText(writeSpec{})
	if err != nil {
		t.Fatal(err)
	}
	text, owner, _, err := after.restoreText(writeSpec{write: changed, stale: stale, fixed: fixed})
	if err != nil {
		t.Fatal(err)
	}
	s := string(text)
	if len(owner) != strings.Count(s, "\n") {
		t.Fatalf("owner has %d lines, text %d", len(owner), strings.Count(s, "\n"))
	}
	for _, c := range stale {
		if !strings.Contains(s, ":"+c.Name+" - [0:0]\n") || !strings.Contains(s, "-X "+c.Name+"\n") {
			t.Errorf("stale chain %s not flushed and deleted", c.Name)
		}
	}
	for _, u := range after.units {
		for _, c := range u.chains {
			declared := strings.Contains(s, ":"+c.name+" - [0:0]")
			if declared != changed[u.id] {
				t.Errorf("unit %s chain %s: declared=%v, want %v", u.id, c.name, declared, changed[u.id])
			}
		}
	}
	// Fixed chains whose rules did not change are left alone: an endpoint
	// change touches no dispatch rule.
	if strings.Contains(s, ":EP-SERVICES") || strings.Contains(s, "-A EP-SERVICES") {
		t.Errorf("partial restore rewrites EP-SERVICES although no dispatch rule changed:\n%s", s)
	}
	// A new service rewrites the dispatch chain, with every service's rules.
	fs = append(fs, datapath.Frontend{Service: datapath.ServicePortName{Namespace: "default", Name: "new"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: netip.MustParseAddr("10.96.9.9"), Family: datapath.IPv4, Port: 80,
		Endpoints: []datapath.Endpoint{ep("10.244.0.9:80", 1, true)}})
	added := Render(cfg, fs)
	text, _, _, err = added.restoreText(writeSpec{write: map[unitID]bool{{datapath.ServicePortName{Namespace: "default", Name: "new"}, datapath.TCP}: true}, fixed: fixed})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{":EP-SERVICES - [0:0]", "-d 10.96.9.9/32", "-d 10.96.0.10/32 -p tcp -m tcp --dport 80", ":EP-HAIRPIN - [0:0]"} {
		if !strings.Contains(string(text), want) {
			t.Errorf("restore adding a service lacks %q", want)
		}
	}
}

func TestRenderRejectsBadFrontend(t *testing.T) {
	fs := samplePlan()
	fs = append(fs, datapath.Frontend{Service: datapath.ServicePortName{Namespace: "x", Name: "bad"}, Kind: datapath.ClusterIP, Protocol: "ICMP", Addr: netip.MustParseAddr("10.96.9.9"), Family: datapath.IPv4, Port: 1})
	rs := Render(Config{Family: datapath.IPv4}, fs)
	if len(rs.Errors) != 1 || !strings.Contains(rs.Errors[0].Error(), "x/bad") {
		t.Fatalf("errors = %v, want one naming x/bad", rs.Errors)
	}
	if slices.Contains(rs.Services(), "x/bad icmp") || len(rs.Services()) == 0 {
		t.Fatalf("services = %v", rs.Services())
	}
}

func parseFloat(s string) (float64, error) { return strconv.ParseFloat(s, 64) }

// BenchmarkPartialRender is the Go side of a partial sync of 10k service
// ports x 10 endpoints where one service changed: rendering with reuse of
// the unchanged units, digests and the restore text.
func BenchmarkPartialRender(b *testing.B) {
	var fs []datapath.Frontend
	for i := range 10000 {
		eps := make([]datapath.Endpoint, 10)
		for j := range eps {
			k := i*10 + j
			eps[j] = datapath.Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(k >> 16), byte(k >> 8), byte(k)}), 8080), Weight: 1}
		}
		fs = append(fs, datapath.Frontend{Service: datapath.ServicePortName{Namespace: "ns", Name: "svc" + strconv.Itoa(i), Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP,
			Addr: netip.AddrFrom4([4]byte{172, 20, byte(i >> 8), byte(i)}), Family: datapath.IPv4, Port: 80, Endpoints: eps})
	}
	cfg := Config{Family: datapath.IPv4, MasqueradeBit: 14}
	base := Render(cfg, fs)
	units := map[unitID]*unit{}
	for _, u := range base.units {
		units[u.id] = u.summarize()
	}
	_, _, fixed, err := base.restoreText(writeSpec{})
	if err != nil {
		b.Fatal(err)
	}
	lastSum := base.fixedSum()
	fs[0].Endpoints = fs[0].Endpoints[1:]
	var size int
	for b.Loop() {
		rs := render(cfg, fs, func(id unitID, _ func() inputSum) *unit {
			if id.service == fs[0].Service {
				return nil
			}
			return units[id]
		})
		_ = rs.chains()
		keep := rs.fixedSum() == lastSum
		text, _, _, err := rs.restoreText(writeSpec{write: map[unitID]bool{{fs[0].Service, datapath.TCP}: true}, fixed: fixed, keepFixed: keep})
		if err != nil || !keep {
			b.Fatalf("keep fixed chains: %v, err %v", keep, err)
		}
		size = len(text)
	}
	b.ReportMetric(float64(size), "restore-bytes")
}
