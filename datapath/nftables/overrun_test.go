package nftables

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// A transaction whose answers (the kernel's echo of every rule added)
// overrun the socket's receive buffer is not taken for a failure when it
// committed: the apply succeeds, counts the overrun, and its table is
// the plan's (a compare afterwards sends nothing).
func TestReceiveOverrun(t *testing.T) {
	kernel(t)
	ns := netns.New(t, "nftoverrun")
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	o := Options{ClusterCIDRs: []netip.Prefix{clusterCIDR}, Registerer: reg}
	// The smallest receive buffer the kernel grants; a send buffer large
	// enough for the batch (google/nftables sizes neither once socket
	// options are given).
	o.sockOpts = []nftables.SockOption{func(c *netlink.Conn) error {
		if err := c.SetReadBuffer(1); err != nil {
			return err
		}
		return c.SetWriteBuffer(8 << 20)
	}}
	p := newProxier(t, ns, o)
	var fs []datapath.Frontend
	for i := range 100 {
		s := svcName("overrun", fmt.Sprintf("s%d", i), "")
		var eps []datapath.Endpoint
		for j := range 10 {
			eps = append(eps, datapath.Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), byte(j + 2)}), 8080), Weight: 1})
		}
		fs = append(fs, clusterIP(s, datapath.TCP, fmt.Sprintf("10.96.1.%d", i+1), 80, eps...))
	}
	plan := newPlan(1, fs...)
	if err := p.Apply(ctx, plan); err != nil {
		t.Fatalf("an apply whose answers overran the receive buffer: %v", err)
	}
	if n := testutil.ToFloat64(p.m.overruns); n == 0 {
		t.Fatal("the receive buffer was not overrun: the test did not test it")
	}
	out := listOurs(t, ns, "ip")
	for i := range 100 {
		if !strings.Contains(out, fmt.Sprintf("chain svc-overrun/s%d {", i)) {
			t.Fatalf("svc-overrun/s%d missing:\n%s", i, out)
		}
	}
	if err := p.Apply(ctx, plan); err != nil {
		t.Fatal(err)
	}
	if st := p.LastStats(); st.Rebuilt || st.Messages != 0 {
		t.Fatalf("a compare after the overrun: %+v, want nothing sent", st)
	}
}
