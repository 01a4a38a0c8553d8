package nftables

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/conntrack"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

var (
	clusterCIDR  = netip.MustParsePrefix("10.244.0.0/16")
	clusterCIDR6 = netip.MustParsePrefix("fd00:244::/64")
)

func newProxier(t *testing.T, ns *netns.NS, o Options) *Proxier {
	t.Helper()
	o.NetNS = int(ns.Handle())
	if o.Conntrack == nil {
		o.NoConntrack = true // TestUDPStaleConntrack sets its own
	}
	if o.MasqueradeBit == 0 {
		o.MasqueradeBit = 14
	}
	p, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func kernel(t *testing.T) {
	t.Helper()
	gate.Root(t)
	gate.Binaries(t, "nft")
}

var elementsRE = regexp.MustCompile(`(?s)elements = \{([^}]*)\}`)

// normalize puts the elements of every set in order, one line: nft lists
// them in the kernel's hash order, which differs from run to run. The
// result is still nft syntax.
func normalize(s string) string {
	return elementsRE.ReplaceAllStringFunc(s, func(m string) string {
		body := elementsRE.FindStringSubmatch(m)[1]
		var es []string
		for _, e := range strings.Split(body, ",") {
			if e = strings.TrimSpace(e); e != "" {
				es = append(es, e)
			}
		}
		slices.Sort(es)
		return "elements = { " + strings.Join(es, ", ") + " }"
	})
}

// canonical is normalize with the blocks of each table (sets, chains) in
// order too: nft lists chains in the order they were created, which
// differs between a rebuild and a table grown by partial syncs.
func canonical(s string) string {
	var out []string
	for _, tb := range strings.SplitAfter(s, "\n}\n") {
		head, body, ok := strings.Cut(tb, "{\n")
		if !ok {
			out = append(out, tb)
			continue
		}
		body = strings.TrimSuffix(body, "}\n")
		blocks := strings.Split(strings.TrimSpace(body), "\n\n")
		slices.Sort(blocks)
		out = append(out, head+"{\n"+strings.Join(blocks, "\n\n")+"\n}\n")
	}
	return strings.Join(out, "")
}

func list(t *testing.T, ns *netns.NS, args ...string) string {
	t.Helper()
	out, err := ns.Run("nft", append([]string{"list"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	return normalize(out)
}

// listOurs lists every table of ours in family fam ("ip" or "ip6"), the
// main one first, then the service tables in order.
func listOurs(t *testing.T, ns *netns.NS, fam string) string {
	t.Helper()
	var names []string
	for _, l := range strings.Split(list(t, ns, "tables", fam), "\n") {
		if n, ok := strings.CutPrefix(strings.TrimSpace(l), "table "+fam+" "); ok && Ours(n) {
			names = append(names, n)
		}
	}
	num := func(n string) int {
		i, err := strconv.Atoi(strings.TrimPrefix(n, ShardPrefix))
		if err != nil {
			return -1 // the main table
		}
		return i
	}
	slices.SortFunc(names, func(a, b string) int { return num(a) - num(b) })
	var b strings.Builder
	for _, n := range names {
		b.WriteString(list(t, ns, "table", fam, n))
	}
	return b.String()
}

// shardTable is the name of the service table of Service s.
func shardTable(s datapath.ServicePortName) string { return tabName(shardOf(s, Shards)) }

func svcName(ns, name, port string) datapath.ServicePortName {
	return datapath.ServicePortName{Namespace: ns, Name: name, Port: port}
}

func clusterIP(s datapath.ServicePortName, proto datapath.Protocol, vip string, port uint16, eps ...datapath.Endpoint) datapath.Frontend {
	a := netip.MustParseAddr(vip)
	return datapath.Frontend{Service: s, Kind: datapath.ClusterIP, Protocol: proto, Addr: a, Family: datapath.FamilyOf(a), Port: port, Endpoints: eps}
}

func nodePort(s datapath.ServicePortName, proto datapath.Protocol, fam datapath.Family, port uint16, eps ...datapath.Endpoint) datapath.Frontend {
	return datapath.Frontend{Service: s, Kind: datapath.NodePort, Protocol: proto, Family: fam, Port: port, Endpoints: eps}
}

func external(s datapath.ServicePortName, kind datapath.Kind, addr string, port uint16, eps ...datapath.Endpoint) datapath.Frontend {
	f := clusterIP(s, datapath.TCP, addr, port, eps...)
	f.Kind = kind
	return f
}

func newPlan(gen uint64, fs ...datapath.Frontend) *datapath.Plan {
	p := &datapath.Plan{Generation: gen, Full: true, Frontends: fs}
	p.Sort()
	return p
}

// goldenPlan has one of each shape this datapath programs, in both
// families.
func goldenPlan() *datapath.Plan {
	web, dns, empty, v6 := svcName("default", "web", "http"), svcName("kube-system", "dns", ""), svcName("default", "empty", ""), svcName("default", "web6", "")
	eps := []datapath.Endpoint{ep("10.244.0.2:8080", 1), ep("10.244.0.3:8080", 1), ep("10.244.0.4:8080", 1)}
	dropped := nodePort(empty, datapath.UDP, datapath.IPv4, 30053)
	dropped.Drop = true
	loc := svcName("default", "local", "")
	all := []datapath.Endpoint{ep("10.244.0.2:8080", 1), ep("10.244.1.3:8080", 1)}
	locNP := nodePort(loc, datapath.TCP, datapath.IPv4, 30040, all[0])
	locNP.LocalOnly, locNP.Cluster = true, all
	fw := external(web, datapath.LoadBalancer, "198.51.100.11", 80, eps...)
	fw.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.168.77.0/24"), netip.MustParsePrefix("10.1.2.3/32"), netip.MustParsePrefix("fd00:77::/64")}
	locLB := external(loc, datapath.LoadBalancer, "198.51.100.40", 80)
	locLB.LocalOnly, locLB.Cluster, locLB.Drop = true, all, true
	sticky6 := svcName("default", "sticky6", "")
	eps6 := []datapath.Endpoint{ep("[fd00:244::2]:8080", 1), ep("[fd00:244::3]:8080", 1)}
	aff6 := clusterIP(sticky6, datapath.TCP, "fd00:96::60", 80, eps6...)
	aff6NP := nodePort(sticky6, datapath.TCP, datapath.IPv6, 30060, eps6...)
	aff6.Affinity, aff6NP.Affinity = 3*time.Hour, 3*time.Hour
	aff4 := clusterIP(svcName("default", "sticky", ""), datapath.TCP, "10.96.0.60", 80, eps[:2]...)
	aff4.Affinity = 10 * time.Second
	return newPlan(1, aff4, aff6, aff6NP,
		clusterIP(loc, datapath.TCP, "10.96.0.40", 80, all...), locNP, locLB, fw,
		clusterIP(web, datapath.TCP, "10.96.0.10", 80, eps...),
		nodePort(web, datapath.TCP, datapath.IPv4, 30080, eps...),
		external(web, datapath.ExternalIP, "192.0.2.10", 80, eps...),
		external(web, datapath.LoadBalancer, "198.51.100.10", 80, eps...),
		external(empty, datapath.LoadBalancer, "198.51.100.20", 80),
		clusterIP(dns, datapath.UDP, "10.96.0.53", 53, ep("10.244.0.2:53", 100), ep("10.244.0.3:53", 300), ep("10.244.0.4:53", 50)),
		clusterIP(empty, datapath.TCP, "10.96.0.20", 80),
		nodePort(empty, datapath.TCP, datapath.IPv4, 30090),
		dropped,
		clusterIP(v6, datapath.TCP, "fd00:96::10", 80, ep("[fd00:244::2]:8080", 1), ep("[fd00:244::3]:8080", 1)),
		nodePort(v6, datapath.TCP, datapath.IPv6, 30080, ep("[fd00:244::2]:8080", 1), ep("[fd00:244::3]:8080", 1)),
	)
}

// The ruleset written over netlink is what Debian's nft lists, and it
// survives nft both ways: the golden text loaded with `nft -f`, and the
// JSON of `nft -j list ruleset` loaded with `nft -j -f` (chains moved
// first, see chainsFirst), each into an empty namespace, list as the
// golden again. Every rule's text (what
// partial syncs compare) is the line nft prints for its expressions.
func TestGoldenRuleset(t *testing.T) {
	kernel(t)
	ns := netns.New(t, "nftgold")
	p := newProxier(t, ns, Options{ClusterCIDRs: []netip.Prefix{clusterCIDR, netip.MustParsePrefix("fd00:244::/48")}, IPv6: true})
	if err := p.Apply(context.Background(), goldenPlan()); err != nil {
		t.Fatal(err)
	}
	roundTrip(t, ns, "ruleset.golden")

	for _, tb := range p.tables {
		chains := tb.f.fixedChains(&p.opts, tb.npIPs != nil)
		for _, fs := range group(goldenPlan(), tb.f.family, true) {
			u, err := buildUnit(tb.f, &p.opts, fs)
			if err != nil {
				t.Fatal(err)
			}
			chains = append(chains, u.chains...)
		}
		for _, c := range chains {
			out := list(t, ns, "chain", tb.f.name, tabName(c.tab), c.name)
			var lines []string
			for _, l := range strings.Split(out, "\n") {
				l = strings.TrimSpace(l)
				if l == "" || l == "}" || strings.HasPrefix(l, "table ") || strings.HasPrefix(l, "chain ") || strings.HasPrefix(l, "type ") {
					continue
				}
				lines = append(lines, l)
			}
			var texts []string
			for _, r := range c.rules {
				texts = append(texts, r.text)
			}
			if !slices.Equal(lines, texts) {
				t.Errorf("%s chain %s: nft prints\n%s\nthe rules' texts are\n%s", tb.f.name, c.name, strings.Join(lines, "\n"), strings.Join(texts, "\n"))
			}
		}
	}
}

// chainsFirst moves every chain of the JSON listing right after its
// table. nft 1.0.6 lists a map's elements before the chains they jump to
// and its own JSON parser then cannot load the listing ("Could not
// process rule: No such file or directory"; the same for a ruleset nft
// itself loaded from text): the order is nft's, the content is checked.
func chainsFirst(t *testing.T, js string) []byte {
	t.Helper()
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(js), &doc); err != nil {
		t.Fatalf("nft -j list ruleset is not JSON: %v", err)
	}
	type id struct{ Family, Table, Name string }
	chains := map[id][]map[string]json.RawMessage{}
	var rest []map[string]json.RawMessage
	for _, o := range doc.Nftables {
		if c, ok := o["chain"]; ok {
			var k id
			if err := json.Unmarshal(c, &k); err != nil {
				t.Fatal(err)
			}
			chains[id{k.Family, k.Table, ""}] = append(chains[id{k.Family, k.Table, ""}], o)
			continue
		}
		rest = append(rest, o)
	}
	var out []map[string]json.RawMessage
	for _, o := range rest {
		out = append(out, o)
		if tb, ok := o["table"]; ok {
			var k id
			if err := json.Unmarshal(tb, &k); err != nil {
				t.Fatal(err)
			}
			out = append(out, chains[id{k.Family, k.Name, ""}]...)
		}
	}
	doc.Nftables = out
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// world is a node with three pods (two serve, one is a client) and an
// outside client, and a proxier programming the node.
type world struct {
	node       *netns.Node
	pods       []*netns.Pod
	client     *netns.NS
	p          *Proxier
	web, empty datapath.ServicePortName
	self, dns  datapath.ServicePortName
	web6       datapath.ServicePortName
}

func newWorld(t *testing.T) *world {
	t.Helper()
	kernel(t)
	w := &world{node: netns.NewNode(t, "nftnode")}
	for _, name := range []string{"nftpod1", "nftpod2", "nftpod3"} {
		w.pods = append(w.pods, w.node.AddPod(name))
	}
	for _, p := range w.pods[:2] {
		if err := p.Serve(8080); err != nil {
			t.Fatal(err)
		}
	}
	w.client = w.node.AddClient("nftcl")
	w.p = newProxier(t, w.node.NS, Options{ClusterCIDRs: []netip.Prefix{clusterCIDR, clusterCIDR6}, IPv6: true})
	w.web, w.empty = svcName("default", "web", "http"), svcName("default", "empty", "")
	w.self, w.dns = svcName("default", "self", ""), svcName("default", "dns", "")
	w.web6 = svcName("default", "web6", "")
	return w
}

func (w *world) eps(pods ...int) []datapath.Endpoint {
	var out []datapath.Endpoint
	for _, i := range pods {
		out = append(out, datapath.Endpoint{Addr: w.pods[i].AddrPort(8080), Weight: 1})
	}
	return out
}

func (w *world) eps6(pods ...int) []datapath.Endpoint {
	var out []datapath.Endpoint
	for _, i := range pods {
		out = append(out, datapath.Endpoint{Addr: w.pods[i].AddrPort6(8080), Weight: 1})
	}
	return out
}

func (w *world) plan(gen uint64, webPods ...int) *datapath.Plan {
	return newPlan(gen,
		clusterIP(w.web, datapath.TCP, "10.96.0.10", 80, w.eps(webPods...)...),
		nodePort(w.web, datapath.TCP, datapath.IPv4, 30080, w.eps(webPods...)...),
		external(w.web, datapath.ExternalIP, "192.0.2.10", 80, w.eps(webPods...)...),
		external(w.web, datapath.LoadBalancer, "198.51.100.10", 80, w.eps(webPods...)...),
		clusterIP(w.web6, datapath.TCP, "fd00:96::10", 80, w.eps6(0, 1)...),
		nodePort(w.web6, datapath.TCP, datapath.IPv6, 30080, w.eps6(0, 1)...),
		clusterIP(w.dns, datapath.UDP, "10.96.0.10", 53, w.eps(0, 1)...),
		clusterIP(w.empty, datapath.TCP, "10.96.0.20", 80),
		clusterIP(w.empty, datapath.TCP, "fd00:96::20", 80),
		nodePort(w.empty, datapath.TCP, datapath.IPv4, 30090),
		clusterIP(w.self, datapath.TCP, "10.96.0.30", 80, w.eps(0)...),
	)
}

const wait = 3 * time.Second

// reach connects n times and returns who answered, failing on any error
// or on a client address other than want.
func reach(t *testing.T, n int, from *netns.NS, dst string, udp bool, want netip.Addr) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for i := range n {
		var r netns.Reply
		var err error
		if udp {
			r, err = from.UDP(netip.MustParseAddrPort(dst), uint16(40000+i), wait)
		} else {
			r, err = from.TCP(netip.MustParseAddrPort(dst), wait)
		}
		if err != nil {
			t.Fatalf("%s from %s: %v", dst, from.Name, err)
		}
		if r.Client.Addr() != want {
			t.Fatalf("%s from %s: the endpoint saw client %s, want %s", dst, from.Name, r.Client.Addr(), want)
		}
		seen[r.Name]++
	}
	return seen
}

func refused(t *testing.T, from *netns.NS, dst string) {
	t.Helper()
	_, err := from.TCP(netip.MustParseAddrPort(dst), wait)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("%s from %s: %v, want connection refused (reject)", dst, from.Name, err)
	}
}

// Real packets through the programmed node: ClusterIP over TCP and UDP,
// spread over both endpoints and not masqueraded from a pod; masqueraded
// from outside the cluster CIDR; NodePort on the node's address,
// ExternalIP and LoadBalancer IP, masqueraded; IPv6 ClusterIP and
// NodePort; a
// Service's endpoints in the shares of their weights; a
// Service without endpoints refused, and a port of a cluster IP that no
// Service has; an endpoint reaching itself through
// its Service (hairpin, masqueraded so that it answers through the node).
func TestPackets(t *testing.T) {
	w := newWorld(t)
	if err := w.p.Apply(context.Background(), w.plan(1, 0, 1)); err != nil {
		t.Fatal(err)
	}
	pod3, gw := w.pods[2], w.node.Gateway
	t.Run("ClusterIP TCP", func(t *testing.T) {
		seen := reach(t, 40, pod3.NS, "10.96.0.10:80", false, pod3.IP)
		if len(seen) != 2 {
			t.Fatalf("answered by %v, want both endpoints", seen)
		}
	})
	t.Run("ClusterIP UDP", func(t *testing.T) {
		seen := reach(t, 40, pod3.NS, "10.96.0.10:53", true, pod3.IP)
		if len(seen) != 2 {
			t.Fatalf("answered by %v, want both endpoints", seen)
		}
	})
	t.Run("masquerade from outside the cluster CIDR", func(t *testing.T) {
		reach(t, 5, w.client, "10.96.0.10:80", false, gw)
	})
	t.Run("NodePort", func(t *testing.T) {
		seen := reach(t, 40, w.client, w.node.LinkIP.String()+":30080", false, gw)
		if len(seen) != 2 {
			t.Fatalf("answered by %v, want both endpoints", seen)
		}
	})
	t.Run("ExternalIP and LoadBalancer IP", func(t *testing.T) {
		for _, dst := range []string{"192.0.2.10:80", "198.51.100.10:80"} {
			if seen := reach(t, 40, w.client, dst, false, gw); len(seen) != 2 {
				t.Fatalf("%s answered by %v, want both endpoints", dst, seen)
			}
		}
	})
	t.Run("IPv6 ClusterIP and NodePort", func(t *testing.T) {
		if seen := reach(t, 40, pod3.NS, "[fd00:96::10]:80", false, pod3.IP6); len(seen) != 2 {
			t.Fatalf("answered by %v, want both endpoints", seen)
		}
		if seen := reach(t, 40, w.client, "["+w.node.LinkIP6.String()+"]:30080", false, w.node.Gateway6); len(seen) != 2 {
			t.Fatalf("answered by %v, want both endpoints", seen)
		}
	})
	t.Run("no endpoints", func(t *testing.T) {
		refused(t, pod3.NS, "10.96.0.20:80")
		refused(t, pod3.NS, "[fd00:96::20]:80")
		refused(t, w.client, w.node.LinkIP.String()+":30090")
	})
	t.Run("a port of a cluster IP no Service has", func(t *testing.T) {
		// Rejected, as kube-proxy's nftables mode does, not routed out
		// of the node (a node without a default route would drop it).
		for _, from := range []*netns.NS{pod3.NS, w.node.NS, w.client} {
			refused(t, from, "10.96.0.10:81")
		}
		refused(t, pod3.NS, "[fd00:96::10]:81")
	})
	t.Run("hairpin", func(t *testing.T) {
		seen := reach(t, 5, w.pods[0].NS, "10.96.0.30:80", false, gw)
		if seen[w.pods[0].PodName] != 5 {
			t.Fatalf("answered by %v, want %s", seen, w.pods[0].PodName)
		}
	})
	t.Run("weights", func(t *testing.T) {
		// Weights 1 and 3: an interval map, a quarter of the slots to
		// the first pod. Of 200 connections the second pod takes 150 on
		// average (σ 6.1); outside 115..185 is a 5.7σ event.
		eps := w.eps(0, 1)
		eps[1].Weight = 3
		pl := w.plan(2, 0, 1)
		pl.Frontends = append(pl.Frontends, clusterIP(svcName("default", "canary", ""), datapath.TCP, "10.96.0.40", 80, eps...))
		pl.Sort()
		if err := w.p.Apply(context.Background(), pl); err != nil {
			t.Fatal(err)
		}
		seen := reach(t, 200, pod3.NS, "10.96.0.40:80", false, pod3.IP)
		if n := seen[w.pods[1].PodName]; n < 115 || n > 185 {
			t.Fatalf("answered by %v, want about 50 and 150", seen)
		}
	})
}

// A partial sync sends only the changed Service, traffic follows it at
// once, and the table it leaves is the one a rebuild from the same plan
// writes. A failed apply is followed by a rebuild. Cleanup removes the
// tables, and HoldsRules sees them before and not after.
func TestPartialSync(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	if err := w.p.Apply(ctx, w.plan(1, 0, 1)); err != nil {
		t.Fatal(err)
	}
	if st := w.p.LastStats(); !st.Rebuilt {
		t.Fatalf("first apply: %+v, want a rebuild", st)
	}
	pod3 := w.pods[2]

	// web moves to pod2 only.
	p := w.plan(2, 1)
	p.Full, p.Changed = false, map[datapath.ServicePortName]bool{w.web: true}
	if err := w.p.Apply(ctx, p); err != nil {
		t.Fatal(err)
	}
	if st := w.p.LastStats(); st.Rebuilt || st.Units != 1 {
		t.Fatalf("partial apply: %+v, want one unit and no rebuild", st)
	}
	if seen := reach(t, 10, pod3.NS, "10.96.0.10:80", false, pod3.IP); seen[w.pods[1].PodName] != 10 {
		t.Fatalf("after the update answered by %v, want only %s", seen, w.pods[1].PodName)
	}

	// empty goes away; self gets endpoints pod1 and pod2 (pod1 stays in
	// the hairpin set through dns and self).
	p = w.plan(3, 1)
	p.Frontends = slices.DeleteFunc(p.Frontends, func(f datapath.Frontend) bool { return f.Service == w.empty })
	for i := range p.Frontends {
		if p.Frontends[i].Service == w.self {
			p.Frontends[i].Endpoints = w.eps(0, 1)
		}
	}
	p.Full, p.Changed = false, map[datapath.ServicePortName]bool{w.empty: true, w.self: true}
	if err := w.p.Apply(ctx, p); err != nil {
		t.Fatal(err)
	}
	got := listOurs(t, w.node.NS, "ip")
	if strings.Contains(got, "10.96.0.20") {
		t.Fatalf("the removed Service is still listed:\n%s", got)
	}

	// The same plan written from scratch in another namespace.
	other := netns.New(t, "nftrebuild")
	q := newProxier(t, other, Options{ClusterCIDRs: []netip.Prefix{clusterCIDR, clusterCIDR6}, IPv6: true})
	full := *p
	full.Full, full.Changed = true, nil
	if err := q.Apply(ctx, &full); err != nil {
		t.Fatal(err)
	}
	got = canonical(list(t, w.node.NS, "ruleset"))
	if want := canonical(list(t, other, "ruleset")); got != want {
		t.Fatalf("after partial syncs:\n%s\nrebuilt from the same plan:\n%s", got, want)
	}

	// A full compare of an unchanged plan sends nothing.
	if err := w.p.Apply(ctx, &full); err != nil {
		t.Fatal(err)
	}
	if st := w.p.LastStats(); st.Rebuilt || st.Messages != 0 || st.Units != 0 {
		t.Fatalf("full compare of the same plan: %+v, want nothing built or sent", st)
	}

	// A compare finds the change the partial syncs missed (web back on
	// pod0 and pod1, named in no plan.Changed), and builds only its port.
	missed := *p
	missed.Generation, missed.Frontends = 4, slices.Clone(p.Frontends)
	for i := range missed.Frontends {
		if f := &missed.Frontends[i]; f.Service == w.web {
			f.Endpoints = w.eps(0, 1)
		}
	}
	missed.Full, missed.Changed = true, nil
	if err := w.p.Apply(ctx, &missed); err != nil {
		t.Fatal(err)
	}
	if st := w.p.LastStats(); st.Rebuilt || st.Units != 1 || st.Messages == 0 {
		t.Fatalf("compare with one missed change: %+v, want one unit built and written", st)
	}
	if seen := reach(t, 20, pod3.NS, "10.96.0.10:80", false, pod3.IP); len(seen) != 2 {
		t.Fatalf("after the compare answered by %v, want both endpoints", seen)
	}

	// A failed apply (the table deleted by hand under a partial sync)
	// returns the error, and the next apply rebuilds whatever it is.
	if _, err := w.node.Run("nft", "delete", "table", "ip", shardTable(w.web)); err != nil {
		t.Fatal(err)
	}
	p = w.plan(4, 0)
	p.Full, p.Changed = false, map[datapath.ServicePortName]bool{w.web: true}
	if err := w.p.Apply(ctx, p); err == nil {
		t.Fatal("a partial sync into a deleted table succeeded")
	}
	p.Generation = 5
	if err := w.p.Apply(ctx, p); err != nil {
		t.Fatal(err)
	}
	if st := w.p.LastStats(); !st.Rebuilt {
		t.Fatalf("apply after a failure: %+v, want a rebuild", st)
	}
	if seen := reach(t, 10, pod3.NS, "10.96.0.10:80", false, pod3.IP); seen[w.pods[0].PodName] != 10 {
		t.Fatalf("after the rebuild answered by %v, want only %s", seen, w.pods[0].PodName)
	}

	if holds, err := w.p.HoldsRules(ctx); err != nil || !holds {
		t.Fatalf("HoldsRules with the tables written: %v, %v", holds, err)
	}
	if err := w.p.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if holds, err := w.p.HoldsRules(ctx); err != nil || holds {
		t.Fatalf("HoldsRules after cleanup: %v, %v", holds, err)
	}
	if out := list(t, w.node.NS, "tables"); strings.Contains(out, TableName) {
		t.Fatalf("after cleanup: %s", out)
	}
	if err := w.p.Cleanup(ctx); err != nil {
		t.Fatalf("cleanup without tables: %v", err)
	}
}

// randomPlan draws a plan over a small world so that updates collide:
// 8 service ports, endpoints from a pool of 12 addresses with weights 1..3
// (an address often loses its last Service: the hairpin set shrinks),
// each frontend kind, traffic policy Local, source ranges, session
// affinity, no endpoints (reject or drop) and absent Services.
func randomPlan(r *rand.Rand, gen uint64, keep *datapath.Plan, change map[datapath.ServicePortName]bool) *datapath.Plan {
	p := &datapath.Plan{Generation: gen}
	affinityOf := map[datapath.ServicePortName]time.Duration{}
	if keep != nil {
		for _, f := range keep.Frontends {
			if !change[f.Service] {
				p.Frontends = append(p.Frontends, f)
			}
		}
	}
	for i := range 8 {
		s := svcName("rnd", fmt.Sprintf("s%d", i), "")
		if keep != nil && !change[s] || r.IntN(5) == 0 {
			continue // kept as it was, or absent
		}
		var eps []datapath.Endpoint
		for j := range 12 {
			if r.IntN(4) == 0 {
				eps = append(eps, datapath.Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 1, byte(j + 2)}), 8080), Weight: uint32(1 + r.IntN(3))})
			}
		}
		if r.IntN(3) == 0 {
			eps = nil
		}
		proto := []datapath.Protocol{datapath.TCP, datapath.UDP}[i%2]
		vip := fmt.Sprintf("10.96.1.%d", i+1)
		var affinity time.Duration
		if r.IntN(4) == 0 {
			affinity = time.Duration(1+r.IntN(3)) * time.Hour
		}
		affinityOf[s] = affinity
		p.Frontends = append(p.Frontends, clusterIP(s, proto, vip, 80, eps...))
		if r.IntN(2) == 0 {
			// Its IPv6 ClusterIP, the same endpoints over IPv6 (with
			// affinity: a set per endpoint, created and deleted with it).
			var eps6 []datapath.Endpoint
			for _, e := range eps {
				a := e.Addr.Addr().As4()
				eps6 = append(eps6, datapath.Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom16([16]byte{0: 0xfd, 4: 2, 5: 0x44, 14: a[2], 15: a[3]}), 8080), Weight: e.Weight})
			}
			p.Frontends = append(p.Frontends, clusterIP(s, proto, fmt.Sprintf("fd00:96::1:%d", i+1), 80, eps6...))
		}
		// Traffic policy Local for the external frontends: half of the
		// endpoints are local, the rest short-circuit only.
		local := r.IntN(3) == 0
		ext := func(f datapath.Frontend) datapath.Frontend {
			f.Protocol = proto
			if local {
				f.LocalOnly, f.Cluster, f.Endpoints = true, eps, eps[:len(eps)/2]
				f.Drop = len(f.Endpoints) == 0 && len(eps) > 0
			}
			return f
		}
		if r.IntN(2) == 0 {
			np := ext(nodePort(s, proto, datapath.IPv4, uint16(30000+i), eps...))
			if len(eps) == 0 {
				np.Drop = r.IntN(2) == 0
			}
			p.Frontends = append(p.Frontends, np)
		}
		if r.IntN(3) == 0 {
			p.Frontends = append(p.Frontends, ext(external(s, datapath.ExternalIP, fmt.Sprintf("192.0.2.%d", i+1), 80, eps...)))
		}
		if r.IntN(3) == 0 {
			lb := ext(external(s, datapath.LoadBalancer, fmt.Sprintf("198.51.100.%d", i+1), 80, eps...))
			for _, pr := range []string{"192.168.77.0/24", "10.0.0.0/8", "10.1.2.3/32"} {
				if r.IntN(2) == 0 {
					lb.SourceRanges = append(lb.SourceRanges, netip.MustParsePrefix(pr))
				}
			}
			p.Frontends = append(p.Frontends, lb)
		}
	}
	for i := range p.Frontends {
		if f := &p.Frontends[i]; keep == nil || change[f.Service] {
			f.Affinity = affinityOf[f.Service]
		}
	}
	p.Sort()
	return p
}

// Any sequence of partial syncs leaves the table that a rebuild of the
// last plan writes, and a full compare afterwards finds nothing to send;
// Apply never modifies the plan.
// The sequence is random with a fixed seed (a failure reproduces).
func TestPartialSyncsMatchRebuild(t *testing.T) {
	kernel(t)
	r := rand.New(rand.NewPCG(27, 1))
	ctx := context.Background()
	a, b := netns.New(t, "nftpartial"), netns.New(t, "nftfull")
	o := Options{ClusterCIDRs: []netip.Prefix{clusterCIDR, clusterCIDR6}, IPv6: true}
	p := newProxier(t, a, o)
	plan := randomPlan(r, 1, nil, nil)
	plan.Full = true
	if err := p.Apply(ctx, plan); err != nil {
		t.Fatal(err)
	}
	sawAffinity, sawAff6 := map[bool]bool{}, false
	defer func() {
		if !t.Failed() && (!sawAffinity[true] || !sawAffinity[false] || !sawAff6) {
			t.Errorf("the sequence never went with and without session affinity: %v (IPv6 affinity sets: %v)", sawAffinity, sawAff6)
		}
	}()
	for step := range 80 {
		change := map[datapath.ServicePortName]bool{}
		for range 1 + r.IntN(3) {
			change[svcName("rnd", fmt.Sprintf("s%d", r.IntN(8)), "")] = true
		}
		next := randomPlan(r, uint64(step+2), plan, change)
		next.Changed = change
		before := next.String()
		if err := p.Apply(ctx, next); err != nil {
			t.Fatalf("step %d: %v\n%s", step, err, next)
		}
		if after := next.String(); after != before {
			t.Fatalf("step %d: Apply modified the plan:\n%s\nwas:\n%s", step, after, before)
		}
		if st := p.LastStats(); st.Rebuilt {
			t.Fatalf("step %d rebuilt", step)
		}
		plan = next
		hasAffinity := strings.Contains(plan.String(), "affinity=")
		sawAffinity[hasAffinity] = true
		sawAff6 = sawAff6 || strings.Contains(listOurs(t, a, "ip6"), "\tset aff-")
		q := newProxier(t, b, o)
		full := *plan
		full.Full, full.Changed = true, nil
		if err := q.Apply(ctx, &full); err != nil {
			t.Fatal(err)
		}
		if got, want := canonical(list(t, a, "ruleset")), canonical(list(t, b, "ruleset")); got != want {
			t.Fatalf("step %d, plan\n%s\nafter partial syncs:\n%s\nrebuilt:\n%s", step, plan, got, want)
		}
		if err := p.Apply(ctx, &full); err != nil {
			t.Fatal(err)
		}
		if st := p.LastStats(); st.Messages != 0 {
			t.Fatalf("step %d: a full compare after the partial sync sent %d operations", step, st.Messages)
		}
	}
}

// A UDP flow follows its conntrack entry: after its endpoint leaves the
// Service the client keeps reaching it, unless the cleaner deletes the
// entry after the apply (as kube-proxy does); a flow to an endpoint that
// still serves is kept.
func TestUDPStaleConntrack(t *testing.T) {
	for _, cleanup := range []bool{true, false} {
		t.Run(fmt.Sprintf("cleanup=%v", cleanup), func(t *testing.T) {
			kernel(t)
			node := netns.NewNode(t, "nftctnode")
			var pods []*netns.Pod
			for _, name := range []string{"nftcta", "nftctb", "nftctc"} {
				p := node.AddPod(name)
				if err := p.Serve(8080); err != nil {
					t.Fatal(err)
				}
				pods = append(pods, p)
			}
			client := node.AddPod("nftctcl")
			o := Options{ClusterCIDRs: []netip.Prefix{clusterCIDR}, NoConntrack: !cleanup}
			if cleanup {
				c, err := conntrack.New(conntrack.Options{})
				if err != nil {
					t.Fatal(err)
				}
				o.Conntrack = c
			}
			p := newProxier(t, node.NS, o)
			dns := svcName("default", "dns", "")
			plan := func(gen uint64, to int, serving ...int) *datapath.Plan {
				f := clusterIP(dns, datapath.UDP, "10.96.0.53", 53, datapath.Endpoint{Addr: pods[to].AddrPort(8080), Weight: 1})
				for _, i := range append([]int{to}, serving...) {
					f.Serving = append(f.Serving, pods[i].AddrPort(8080))
				}
				pl := newPlan(gen, f)
				if gen > 1 {
					pl.Full, pl.Changed = false, map[datapath.ServicePortName]bool{dns: true}
				}
				return pl
			}
			apply := func(pl *datapath.Plan) {
				t.Helper()
				// The cleaner works in the namespace of the calling thread.
				if err := node.Do(func() error { return p.Apply(context.Background(), pl) }); err != nil {
					t.Fatal(err)
				}
			}
			ask := func(want string) {
				t.Helper()
				r, err := client.UDP(netip.MustParseAddrPort("10.96.0.53:53"), 45000, wait)
				if err != nil {
					t.Fatal(err)
				}
				if r.Name != want {
					t.Fatalf("answered by %s, want %s", r.Name, want)
				}
			}
			apply(plan(1, 0))
			ask("nftcta")
			apply(plan(2, 1))
			if !cleanup {
				ask("nftcta") // stuck on the old endpoint
				return
			}
			ask("nftctb")
			// b is no longer chosen but still serves: its flow is kept.
			apply(plan(3, 2, 1))
			ask("nftctb")
		})
	}
}

// Traffic policy Local with real packets: an outside client reaches only
// the local endpoint and keeps its address; pods and the node itself are
// short-circuited to every endpoint (the node masqueraded); a frontend
// without local endpoints drops outside clients but still serves pods and
// the node (its no-endpoint check looks after DNAT, as kube-proxy's).
func TestLocalPolicy(t *testing.T) {
	w := newWorld(t)
	loc := svcName("default", "local", "")
	all := w.eps(0, 1)
	np := nodePort(loc, datapath.TCP, datapath.IPv4, 30040, w.eps(0)...)
	np.LocalOnly, np.Cluster = true, all
	lb := external(loc, datapath.LoadBalancer, "198.51.100.40", 80)
	lb.LocalOnly, lb.Cluster, lb.Drop = true, all, true
	if err := w.p.Apply(context.Background(), newPlan(1, clusterIP(loc, datapath.TCP, "10.96.0.40", 80, all...), np, lb)); err != nil {
		t.Fatal(err)
	}
	pod3, nodePortAddr := w.pods[2], w.node.LinkIP.String()+":30040"
	clientIP := netip.MustParseAddr("192.168.77.2")
	if seen := reach(t, 20, w.client, nodePortAddr, false, clientIP); seen[w.pods[0].PodName] != 20 {
		t.Fatalf("outside client answered by %v, want only the local endpoint %s", seen, w.pods[0].PodName)
	}
	if seen := reach(t, 40, pod3.NS, nodePortAddr, false, pod3.IP); len(seen) != 2 {
		t.Fatalf("pod answered by %v, want both endpoints (short-circuit)", seen)
	}
	if seen := reach(t, 40, w.node.NS, nodePortAddr, false, w.node.Gateway); len(seen) != 2 {
		t.Fatalf("node answered by %v, want both endpoints (short-circuit, masqueraded)", seen)
	}
	if seen := reach(t, 40, pod3.NS, "198.51.100.40:80", false, pod3.IP); len(seen) != 2 {
		t.Fatalf("pod to the LoadBalancer IP answered by %v, want both endpoints", seen)
	}
	if seen := reach(t, 40, w.node.NS, "198.51.100.40:80", false, w.node.Gateway); len(seen) != 2 {
		t.Fatalf("node to the LoadBalancer IP answered by %v, want both endpoints (short-circuit, masqueraded)", seen)
	}
	// Dropped, not refused: no answer at all. The wait is the test's
	// choice, not a speed it asserts.
	_, err := w.client.TCP(netip.MustParseAddrPort("198.51.100.40:80"), 500*time.Millisecond)
	var ne interface{ Timeout() bool }
	if err == nil || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("outside client to a Local LoadBalancer IP without local endpoints: %v, want no answer (drop)", err)
	}
}

// loadBalancerSourceRanges with real packets: a client inside a range
// reaches the load balancer's address, one outside is dropped (no
// answer); a pod inside another range reaches it, and the firewall looks
// at the load balancer's address only, not at the Service's others.
func TestSourceRanges(t *testing.T) {
	w := newWorld(t)
	fw := svcName("default", "fw", "")
	open := external(fw, datapath.LoadBalancer, "198.51.100.50", 80, w.eps(0, 1)...)
	open.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.168.77.0/24")}
	closed := external(fw, datapath.LoadBalancer, "198.51.100.51", 80, w.eps(0, 1)...)
	closed.SourceRanges = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24"), netip.MustParsePrefix("fd00:1::/64")}
	if err := w.p.Apply(context.Background(), newPlan(1, clusterIP(fw, datapath.TCP, "10.96.0.50", 80, w.eps(0, 1)...), open, closed)); err != nil {
		t.Fatal(err)
	}
	pod3, gw := w.pods[2], w.node.Gateway
	reach(t, 5, w.client, "198.51.100.50:80", false, gw)
	reach(t, 5, pod3.NS, "198.51.100.51:80", false, gw)
	reach(t, 5, w.client, "10.96.0.50:80", false, gw)
	// The wait is the test's choice, not a speed it asserts.
	_, err := w.client.TCP(netip.MustParseAddrPort("198.51.100.51:80"), 500*time.Millisecond)
	var ne interface{ Timeout() bool }
	if err == nil || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("outside client to a load balancer it is not allowed to reach: %v, want no answer (drop)", err)
	}
}

// nodePortAddresses: node ports answer only on the node's addresses in
// the prefixes (the set @nodeport-ips instead of fib), and "primary"
// follows the plan's NodeIPs: unknown, every local address; known, only
// it (the fixed rule changes: the table is rewritten).
func TestNodePortAddresses(t *testing.T) {
	kernel(t)
	for _, primary := range []bool{false, true} {
		t.Run(fmt.Sprintf("primary=%v", primary), func(t *testing.T) {
			w := newWorld(t)
			o := Options{ClusterCIDRs: []netip.Prefix{clusterCIDR}, NodePortPrimary: primary}
			if !primary {
				o.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("192.168.77.0/24")}
			}
			p := newProxier(t, w.node.NS, o)
			apply := func(pl *datapath.Plan) {
				t.Helper()
				// LocalAddrs asks the namespace of the calling thread.
				if err := w.node.Do(func() error { return p.Apply(context.Background(), pl) }); err != nil {
					t.Fatal(err)
				}
			}
			pod3 := w.pods[2]
			onLink, onBridge := w.node.LinkIP.String()+":30080", w.node.Gateway.String()+":30080"
			pl := w.plan(1, 0, 1)
			if primary {
				// The Node's address is not known yet: every local
				// address answers (masqueraded: a node port).
				apply(pl)
				reach(t, 5, pod3.NS, onBridge, false, w.node.Gateway)
				pl = w.plan(2, 0, 1)
				pl.NodeIPs = []netip.Addr{w.node.LinkIP}
			}
			apply(pl)
			if primary && !p.LastStats().Rebuilt {
				t.Fatalf("restricting node ports: %+v, want the table rewritten", p.LastStats())
			}
			reach(t, 5, w.client, onLink, false, w.node.Gateway)
			if _, err := pod3.TCP(netip.MustParseAddrPort(onBridge), wait); err == nil {
				t.Fatalf("node port answered on %s, outside nodePortAddresses", onBridge)
			}
			got := listOurs(t, w.node.NS, "ip")
			// The restricted rules' texts are nft's lines, as TestGoldenRuleset
			// holds for the others.
			for _, want := range []string{
				"\t\t" + ruleNodePortDispatch(famIPv4, true, mapNodePorts).text + "\n",
				"\t\t" + ruleNodePortDispatch(famIPv4, true, mapNoEPPorts).text + "\n",
				"elements = { " + w.node.LinkIP.String() + " }",
			} {
				if !strings.Contains(got, want) {
					t.Errorf("table lacks %q:\n%s", want, got)
				}
			}
		})
	}
}

// Session affinity: one set of client addresses per endpoint of a
// Service with affinity, as kube-proxy's nftables mode. A client sticks
// to the endpoint it first got, the endpoint's set lists it, the rules'
// texts are nft's lines, and the ruleset reloads with nft -f and lists
// as JSON. When that endpoint leaves the Service, its set goes with it
// and the client moves, although the old endpoint still answers.
func TestAffinity(t *testing.T) {
	w := newWorld(t)
	aff := svcName("default", "sticky", "")
	plan := func(gen uint64, pods ...int) *datapath.Plan {
		f := clusterIP(aff, datapath.TCP, "10.96.0.60", 80, w.eps(pods...)...)
		f.Affinity = 3 * time.Hour
		pl := newPlan(gen, f, clusterIP(w.web, datapath.TCP, "10.96.0.10", 80, w.eps(0, 1)...))
		if gen > 1 {
			pl.Full, pl.Changed = false, map[datapath.ServicePortName]bool{aff: true}
		}
		return pl
	}
	ctx := context.Background()
	if err := w.p.Apply(ctx, plan(1, 0, 1)); err != nil {
		t.Fatal(err)
	}
	pod3 := w.pods[2]
	seen := reach(t, 20, pod3.NS, "10.96.0.60:80", false, pod3.IP)
	if len(seen) != 1 {
		t.Fatalf("answered by %v, want one endpoint every time (affinity)", seen)
	}
	var first string
	for name := range seen {
		first = name
	}
	firstIdx := slices.IndexFunc(w.pods, func(p *netns.Pod) bool { return p.PodName == first })
	set := affinitySetName(aff, w.pods[firstIdx].AddrPort(8080))
	if out := list(t, w.node.NS, "set", "ip", shardTable(aff), set); !strings.Contains(out, pod3.IP.String()+" timeout 3h expires") {
		t.Fatalf("set %s lacks the client %s:\n%s", set, pod3.IP, out)
	}

	// Rule texts are nft's lines; the ruleset reloads as text.
	u, err := buildUnit(famIPv4, &w.p.opts, plan(1, 0, 1).Frontends[:1])
	if err != nil {
		t.Fatal(err)
	}
	chain := list(t, w.node.NS, "chain", "ip", shardTable(aff), u.chains[0].name)
	for _, r := range u.chains[0].rules {
		if !strings.Contains(chain, "\t\t"+r.text+"\n") {
			t.Errorf("nft does not print %q:\n%s", r.text, chain)
		}
	}
	text := netns.New(t, "nftafftext")
	rs := list(t, w.node.NS, "ruleset")
	rs = regexp.MustCompile(`(?m)^\t\telements = \{[^}]*expires[^}]*\}\n`).ReplaceAllString(rs, "")
	f := filepath.Join(t.TempDir(), "ruleset.nft")
	if err := os.WriteFile(f, []byte(rs), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := text.Run("nft", "-f", f); err != nil {
		t.Fatal(err)
	}
	if back := list(t, text, "ruleset"); canonical(back) != canonical(rs) {
		t.Errorf("reloaded with nft -f:\n%s\nwant:\n%s", back, rs)
	}
	// As JSON, Debian 12's nft (1.0.6) lists every rule, the updates too.
	js, err := w.node.Run("nft", "-j", "list", "ruleset")
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid([]byte(js)) || !strings.Contains(js, `"name": "`+set+`"`) || !strings.Contains(js, `"update"`) {
		t.Fatalf("nft -j list ruleset: %s", js)
	}

	// The endpoint the client sticks to leaves the Service (it still
	// answers): the client moves to the other one, and the set is gone.
	other := 1 - firstIdx
	if err := w.p.Apply(ctx, plan(2, other)); err != nil {
		t.Fatal(err)
	}
	if seen := reach(t, 5, pod3.NS, "10.96.0.60:80", false, pod3.IP); seen[w.pods[other].PodName] != 5 {
		t.Fatalf("after the endpoint left, answered by %v, want %s", seen, w.pods[other].PodName)
	}
	if out := listOurs(t, w.node.NS, "ip"); strings.Contains(out, "set "+set+" ") {
		t.Fatalf("the set of the removed endpoint is still there:\n%s", out)
	}
}

// Session affinity over IPv6: one set of client addresses per endpoint
// of the Service. A client sticks to the endpoint it first got (through
// the cluster IP, and an outside client through the node port), in the
// same apply as the IPv4 frontend of the Service (also sticky) and the
// partial ones after it; the endpoint's set lists the client; when that
// endpoint leaves the Service its set goes and the client moves,
// although the old endpoint still answers. With a short timeout the
// client's entry expires and it is placed anew.
func TestAffinityIPv6(t *testing.T) {
	w := newWorld(t)
	aff, short := svcName("default", "sticky", ""), svcName("default", "short", "")
	plan := func(gen uint64, pods ...int) *datapath.Plan {
		f4 := clusterIP(aff, datapath.TCP, "10.96.0.60", 80, w.eps(0, 1)...)
		f6 := clusterIP(aff, datapath.TCP, "fd00:96::60", 80, w.eps6(pods...)...)
		np6 := nodePort(aff, datapath.TCP, datapath.IPv6, 30061, w.eps6(pods...)...)
		s6 := clusterIP(short, datapath.TCP, "fd00:96::61", 80, w.eps6(0, 1)...)
		f4.Affinity, f6.Affinity, np6.Affinity, s6.Affinity = time.Hour, time.Hour, time.Hour, time.Second
		pl := newPlan(gen, f4, f6, np6, s6, clusterIP(w.web6, datapath.TCP, "fd00:96::10", 80, w.eps6(0, 1)...))
		if gen > 1 {
			pl.Full, pl.Changed = false, map[datapath.ServicePortName]bool{aff: true}
		}
		return pl
	}
	ctx := context.Background()
	pod3 := w.pods[2]
	var first string
	for gen := uint64(1); gen <= 2; gen++ {
		if err := w.p.Apply(ctx, plan(gen, 0, 1)); err != nil {
			t.Fatalf("apply %d: %v", gen, err)
		}
		if seen := reach(t, 10, pod3.NS, "10.96.0.60:80", false, pod3.IP); len(seen) != 1 {
			t.Fatalf("apply %d: IPv4 affinity answered by %v, want one endpoint every time", gen, seen)
		}
		seen := reach(t, 20, pod3.NS, "[fd00:96::60]:80", false, pod3.IP6)
		if len(seen) != 1 {
			t.Fatalf("apply %d: IPv6 affinity answered by %v, want one endpoint every time", gen, seen)
		}
		for name := range seen {
			if first != "" && name != first {
				t.Fatalf("apply %d: answered by %s, before by %s", gen, name, first)
			}
			first = name
		}
		if seen := reach(t, 20, pod3.NS, "[fd00:96::10]:80", false, pod3.IP6); len(seen) != 2 {
			t.Fatalf("apply %d: IPv6 ClusterIP without affinity answered by %v, want both endpoints", gen, seen)
		}
		// The node port, from outside (masqueraded: the pods see the node).
		if seen := reach(t, 20, w.client, "["+w.node.LinkIP6.String()+"]:30061", false, w.node.Gateway6); len(seen) != 1 {
			t.Fatalf("apply %d: IPv6 node port with affinity answered by %v, want one endpoint every time", gen, seen)
		}
	}
	firstIdx := slices.IndexFunc(w.pods, func(p *netns.Pod) bool { return p.PodName == first })
	set := affinitySetName(aff, w.pods[firstIdx].AddrPort6(8080))
	if out := list(t, w.node.NS, "set", "ip6", shardTable(aff), set); !strings.Contains(out, pod3.IP6.String()) {
		t.Fatalf("set %s lacks the client %s:\n%s", set, pod3.IP6, out)
	}

	// The endpoint the client sticks to leaves the Service (it still
	// answers): the client moves to the other one, and the set is gone.
	other := 1 - firstIdx
	if err := w.p.Apply(ctx, plan(3, other)); err != nil {
		t.Fatal(err)
	}
	if seen := reach(t, 5, pod3.NS, "[fd00:96::60]:80", false, pod3.IP6); seen[w.pods[other].PodName] != 5 {
		t.Fatalf("after the endpoint left, answered by %v, want %s", seen, w.pods[other].PodName)
	}
	if out := listOurs(t, w.node.NS, "ip6"); strings.Contains(out, "set "+set+" ") {
		t.Fatalf("the set of the removed endpoint is still there:\n%s", out)
	}
	// Back: its set is created again, empty; the client stays where it is.
	if err := w.p.Apply(ctx, plan(4, 0, 1)); err != nil {
		t.Fatal(err)
	}
	if seen := reach(t, 10, pod3.NS, "[fd00:96::60]:80", false, pod3.IP6); seen[w.pods[other].PodName] != 10 {
		t.Fatalf("after the endpoint came back, answered by %v, want %s every time", seen, w.pods[other].PodName)
	}

	// A timeout of 1s: the entry expires (the kernel lists no expired
	// element), and a later connection may go to either endpoint; within
	// at most 20 rounds (a chance of 2^-20 to stay on one), it moves.
	var got []string
	for round := range 20 {
		r, err := pod3.NS.TCP(netip.MustParseAddrPort("[fd00:96::61]:80"), wait)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.Name)
		if round > 0 && r.Name != got[0] {
			break
		}
		time.Sleep(1500 * time.Millisecond)
		s := affinitySetName(short, w.pods[slices.IndexFunc(w.pods, func(p *netns.Pod) bool { return p.PodName == r.Name })].AddrPort6(8080))
		if out := list(t, w.node.NS, "set", "ip6", shardTable(short), s); strings.Contains(out, pod3.IP6.String()) {
			t.Fatalf("round %d: the entry of %s outlived its timeout of 1s:\n%s", round, pod3.IP6, out)
		}
	}
	if !slices.ContainsFunc(got, func(n string) bool { return n != got[0] }) {
		t.Fatalf("after each timeout the client went to %v, never elsewhere", got)
	}
}

// Tampered sees our table deleted or a chain added to it by hand, not
// another table's commit; the next Apply rewrites the table and traffic
// flows again.
func TestTampered(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	plan := w.plan(1, 0, 1)
	if err := w.p.Apply(ctx, plan); err != nil {
		t.Fatal(err)
	}
	tampered := func() bool {
		t.Helper()
		got, err := w.p.Tampered(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if tampered() || tampered() {
		t.Fatal("tampered right after our own apply")
	}
	if _, err := w.node.Run("nft", "add", "table", "ip", "someone-else"); err != nil {
		t.Fatal(err)
	}
	if tampered() {
		t.Fatal("another table's commit counted as tampering")
	}
	pod3 := w.pods[2]
	for i, hand := range [][]string{
		{"add", "chain", "ip", TableName, "intruder"},
		{"delete", "table", "ip", TableName},
		{"delete", "table", "ip", ShardPrefix + "3"},
	} {
		if _, err := w.node.Run("nft", hand...); err != nil {
			t.Fatal(err)
		}
		if !tampered() {
			t.Fatalf("nft %v not seen", hand)
		}
		next := w.plan(uint64(i+2), 0, 1)
		next.Full = true
		if err := w.p.Apply(ctx, next); err != nil {
			t.Fatal(err)
		}
		if st := w.p.LastStats(); !st.Rebuilt {
			t.Fatalf("after nft %v: %+v, want the table rewritten", hand, st)
		}
		if tampered() {
			t.Fatalf("after the rewrite, still tampered")
		}
		if strings.Contains(listOurs(t, w.node.NS, "ip"), "intruder") {
			t.Fatal("the hand-made chain survived the rewrite")
		}
		if seen := reach(t, 20, pod3.NS, "10.96.0.10:80", false, pod3.IP); len(seen) != 2 {
			t.Fatalf("after the rewrite answered by %v, want both endpoints", seen)
		}
	}
}

// roundTrip checks the ruleset of ns against testdata/name (rewritten with
// -update) and that it survives Debian's nft both ways: the golden text
// loaded with `nft -f`, and the JSON of `nft -j list ruleset` loaded with
// `nft -j -f` (chains moved first, see chainsFirst), each into an empty
// namespace, list as the golden again. It returns the listing.
func roundTrip(t *testing.T, ns *netns.NS, name string) string {
	t.Helper()
	got := list(t, ns, "ruleset")
	golden := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Fatalf("nft list ruleset:\n%s\nwant (%s):\n%s", got, golden, want)
	}
	text := netns.New(t, "nfttext")
	if _, err := text.Run("nft", "-f", golden); err != nil {
		t.Fatal(err)
	}
	if back := list(t, text, "ruleset"); back != got {
		t.Errorf("golden loaded with nft -f lists as:\n%s", back)
	}
	js, err := ns.Run("nft", "-j", "list", "ruleset")
	if err != nil {
		t.Fatal(err)
	}
	jf := filepath.Join(t.TempDir(), "ruleset.json")
	if err := os.WriteFile(jf, chainsFirst(t, js), 0o644); err != nil {
		t.Fatal(err)
	}
	jsonNS := netns.New(t, "nftjson")
	if _, err := jsonNS.Run("nft", "-j", "-f", jf); err != nil {
		t.Fatal(err)
	}
	if back := list(t, jsonNS, "ruleset"); back != got {
		t.Errorf("nft -j list ruleset loaded with nft -j -f lists as:\n%s", back)
	}
	return got
}

// Session affinity counts its timeout from the client's last connection,
// as kube-proxy's does (its update refreshes the entry on every hit), not
// from the first: a client that keeps connecting stays on its endpoint
// past the timeout, in both families. The client first reaches the
// Service while it has one endpoint A; then a second endpoint B comes
// with 1000 times A's weight, so that a client whose entry expired would
// almost surely (999/1000) be placed on B. Only pairs of connections
// closer together than the timeout (measured from the start of one to
// the end of the next, so load that delays a connection cannot make the
// test fail) must land on the same endpoint; the test needs one run of
// such connections, on A, spanning more than twice the timeout.
func TestAffinityRenewed(t *testing.T) {
	w := newWorld(t)
	s := svcName("default", "renew", "")
	const timeout = 2 * time.Second
	gen := uint64(0)
	apply := func(eps4, eps6 []datapath.Endpoint) {
		t.Helper()
		f4 := clusterIP(s, datapath.TCP, "10.96.0.70", 80, eps4...)
		f6 := clusterIP(s, datapath.TCP, "fd00:96::70", 80, eps6...)
		f4.Affinity, f6.Affinity = timeout, timeout
		gen++
		pl := newPlan(gen, f4, f6)
		if gen > 1 {
			pl.Full, pl.Changed = false, map[datapath.ServicePortName]bool{s: true}
		}
		if err := w.p.Apply(context.Background(), pl); err != nil {
			t.Fatalf("apply %d: %v", gen, err)
		}
	}
	heavy := func(eps []datapath.Endpoint) []datapath.Endpoint {
		eps[1].Weight = 1000
		return eps
	}
	pod3, a := w.pods[2], w.pods[0].PodName
	for _, fam := range []struct {
		dst  string
		from netip.Addr
	}{{"10.96.0.70:80", pod3.IP}, {"[fd00:96::70]:80", pod3.IP6}} {
		t.Run(fam.dst, func(t *testing.T) {
			apply(w.eps(0), w.eps6(0))
			dst := netip.MustParseAddrPort(fam.dst)
			prevStart := time.Now()
			if seen := reach(t, 1, pod3.NS, fam.dst, false, fam.from); seen[a] != 1 {
				t.Fatalf("with one endpoint answered by %v, want %s", seen, a)
			}
			apply(heavy(w.eps(0, 1)), heavy(w.eps6(0, 1)))
			runStart := prevStart // the start of the run of connections on A
			for i := range 80 {
				time.Sleep(timeout / 8)
				start := time.Now()
				r, err := pod3.NS.TCP(dst, wait)
				if err != nil {
					t.Fatal(err)
				}
				end := time.Now()
				tight := end.Sub(prevStart) < timeout
				switch {
				case r.Name == a && tight && start.Sub(runStart) > 2*timeout:
					return // stayed on A for more than twice the timeout
				case r.Name == a && tight:
				case tight:
					t.Fatalf("connection %d, %v after the one before began, went to %s: the entry on %s expired about %v after the run began although the client kept connecting",
						i, end.Sub(prevStart).Round(time.Millisecond), r.Name, a, start.Sub(runStart).Round(100*time.Millisecond))
				case r.Name == a:
					// Load kept the client away longer than the timeout:
					// its entry may have expired; the run starts again.
					runStart = start
				default:
					t.Skipf("the machine is too loaded to connect every %v: connection %d came %v after the one before began and left %s",
						timeout/8, i, end.Sub(prevStart).Round(time.Millisecond), a)
				}
				prevStart = start
			}
			t.Skipf("the machine is too loaded to connect every %v for %v", timeout/8, 2*timeout)
		})
	}
}
