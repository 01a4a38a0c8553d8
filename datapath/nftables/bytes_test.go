package nftables

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// bulkPlan is n ClusterIP Services of ten endpoints each; Service s0's
// endpoints are shifted by shift.
func bulkPlan(gen uint64, n int, shift byte) *datapath.Plan {
	var fs []datapath.Frontend
	for i := range n {
		var eps []datapath.Endpoint
		for j := range 10 {
			last := byte(j + 2)
			if i == 0 {
				last += shift
			}
			eps = append(eps, datapath.Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), last}), 8080), Weight: 1})
		}
		s := svcName("bulk", fmt.Sprintf("s%d", i), "")
		fs = append(fs, clusterIP(s, datapath.TCP, fmt.Sprintf("10.96.%d.%d", i>>8, i&0xff), 80, eps...))
	}
	return newPlan(gen, fs...)
}

// TestSyncBytes: the bytes one Service's change sends to the kernel do
// not depend on how many Services the table holds (here 10 and 1,000),
// and the status and MetricSyncBytes show them; a rewrite sends more.
func TestSyncBytes(t *testing.T) {
	kernel(t)
	ctx := context.Background()
	var sent []int
	for _, n := range []int{10, 1000} {
		ns := netns.New(t, fmt.Sprintf("nftbytes%d", n))
		reg := prometheus.NewRegistry()
		p := newProxier(t, ns, Options{ClusterCIDRs: []netip.Prefix{clusterCIDR}, Registerer: reg})
		if err := p.Apply(ctx, bulkPlan(1, n, 0)); err != nil {
			t.Fatal(err)
		}
		whole := p.LastStats().Bytes
		change := bulkPlan(2, n, 20)
		change.Full, change.Changed = false, map[datapath.ServicePortName]bool{svcName("bulk", "s0", ""): true}
		if err := p.Apply(ctx, change); err != nil {
			t.Fatal(err)
		}
		st := p.LastStats()
		if st.Rebuilt || st.Transactions != 1 || st.Bytes < 16*st.Messages {
			t.Fatalf("%d Services: the change: %+v, want one partial transaction of at least a header per message", n, st)
		}
		if whole <= st.Bytes {
			t.Fatalf("%d Services: the table written whole sent %d bytes, one change %d", n, whole, st.Bytes)
		}
		if m := testutil.ToFloat64(p.m.bytes); int(m) != st.Bytes {
			t.Fatalf("%d Services: %s = %v, the apply sent %d", n, MetricSyncBytes, m, st.Bytes)
		}
		js, err := json.Marshal(p.Status())
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(js), fmt.Sprintf(`"bytes":%d`, st.Bytes)) {
			t.Fatalf("%d Services: the status lacks the bytes: %s", n, js)
		}
		t.Logf("%d Services: one change sent %d bytes in %d messages; the table whole %d", n, st.Bytes, st.Messages, whole)
		sent = append(sent, st.Bytes)
	}
	if sent[0] != sent[1] {
		t.Fatalf("one Service's change sent %d bytes at 10 Services, %d at 1,000", sent[0], sent[1])
	}
}
