package nftables

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// Status and the metrics count what the kernel holds: the chains nft
// lists in each table after a rewrite and after partial syncs that add
// and remove Services, and the operations of the last transaction.
func TestStatusAndMetrics(t *testing.T) {
	kernel(t)
	ns := netns.New(t, "nftstatus")
	reg := prometheus.NewRegistry()
	p := newProxier(t, ns, Options{ClusterCIDRs: []netip.Prefix{clusterCIDR, clusterCIDR6}, IPv6: true, Registerer: reg})
	check := func(what string) {
		t.Helper()
		st := p.Status()
		if len(st.Tables) != 2 {
			t.Fatalf("%s: %d tables in the status, want 2", what, len(st.Tables))
		}
		for _, ts := range st.Tables {
			want := strings.Count(listOurs(t, ns, ts.Family), "\tchain ")
			if tables := strings.Count(listOurs(t, ns, ts.Family), "table "+ts.Family+" "); ts.Tables != tables {
				t.Errorf("%s: %s: status says %d tables, nft lists %d", what, ts.Family, ts.Tables, tables)
			}
			if ts.Chains != want || !ts.Written {
				t.Errorf("%s: %s: status says %d chains (written %v), nft lists %d", what, ts.Family, ts.Chains, ts.Written, want)
			}
			if m := testutil.ToFloat64(p.m.chains.WithLabelValues(ts.Family)); int(m) != want {
				t.Errorf("%s: %s: %s is %v, nft lists %d", what, ts.Family, MetricChains, m, want)
			}
		}
		if ops := testutil.ToFloat64(p.m.ops); int(ops) != st.LastApply.Messages || ops == 0 {
			t.Errorf("%s: %s is %v, the last apply sent %d", what, MetricOperations, ops, st.LastApply.Messages)
		}
	}
	plan := detectPlan(nil)
	if err := p.Apply(context.Background(), plan); err != nil {
		t.Fatal(err)
	}
	check("rewrite")
	if !p.Status().LastApply.Rebuilt || testutil.CollectAndCount(reg, MetricFullDuration) != 1 {
		t.Errorf("the first apply is no rewrite in the status or the full-sync histogram")
	}
	// A Service more, then the IPv4 web Service gone: partial syncs.
	more := detectPlan(nil)
	extra := svcName("default", "extra", "")
	more.Frontends = append(more.Frontends, clusterIP(extra, datapath.TCP, "10.96.0.99", 80, ep("10.244.1.2:8080", 1)))
	more.Sort()
	more.Generation, more.Full, more.Changed = 2, false, map[datapath.ServicePortName]bool{extra: true}
	if err := p.Apply(context.Background(), more); err != nil {
		t.Fatal(err)
	}
	check("a Service added")
	web := svcName("default", "web", "")
	var fewer []datapath.Frontend
	for _, f := range more.Frontends {
		if f.Service != web {
			fewer = append(fewer, f)
		}
	}
	less := newPlan(3, fewer...)
	less.Full, less.Changed = false, map[datapath.ServicePortName]bool{web: true}
	if err := p.Apply(context.Background(), less); err != nil {
		t.Fatal(err)
	}
	check("a Service removed")
	if p.Status().LastApply.Rebuilt {
		t.Errorf("a partial sync is a rewrite in the status")
	}
}
