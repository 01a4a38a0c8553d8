package nftables

import (
	"context"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/internal/testkit/vm"
)

// TestSCTP: real SCTP associations through a ClusterIP (from a pod,
// source kept; from the outside client, masqueraded), a NodePort and a
// LoadBalancer IP, spread over both endpoints; a Service without
// endpoints is rejected as kube-proxy's nftables mode rejects it and
// makes no association. The host kernel has no SCTP, so it runs in the
// VM (test/vm's TestGuestPackages, -test.run=SCTP).
func TestSCTP(t *testing.T) {
	vm.Guest(t)
	gate.SCTP(t)
	w := newWorld(t)
	for _, p := range w.pods[:2] {
		if err := p.ServeSCTP(8080); err != nil {
			t.Fatal(err)
		}
	}
	sig, none := svcName("default", "sig", "sctp"), svcName("default", "none", "sctp")
	lb := clusterIP(sig, datapath.SCTP, "198.51.100.32", 132, w.eps(0, 1)...)
	lb.Kind = datapath.LoadBalancer
	if err := w.p.Apply(context.Background(), newPlan(1,
		clusterIP(sig, datapath.SCTP, "10.96.0.32", 132, w.eps(0, 1)...),
		nodePort(sig, datapath.SCTP, datapath.IPv4, 30132, w.eps(0, 1)...),
		lb,
		clusterIP(none, datapath.SCTP, "10.96.0.33", 132),
	)); err != nil {
		t.Fatal(err)
	}

	pod3, gw := w.pods[2], w.node.Gateway
	for _, c := range []struct {
		name string
		from *netns.NS
		dst  netip.AddrPort
		saw  netip.Addr
	}{
		{"pod -> ClusterIP", pod3.NS, netip.MustParseAddrPort("10.96.0.32:132"), pod3.IP},
		{"client -> ClusterIP", w.client, netip.MustParseAddrPort("10.96.0.32:132"), gw},
		{"client -> NodePort", w.client, netip.AddrPortFrom(w.node.LinkIP, 30132), gw},
		{"client -> LoadBalancer IP", w.client, netip.MustParseAddrPort("198.51.100.32:132"), gw},
	} {
		seen := map[string]int{}
		for range 20 {
			r, err := c.from.SCTP(c.dst, wait)
			if err != nil {
				t.Fatalf("%s (%s): %v", c.name, c.dst, err)
			}
			if r.Client.Addr() != c.saw {
				t.Fatalf("%s (%s): the endpoint saw client %s, want %s", c.name, c.dst, r.Client.Addr(), c.saw)
			}
			seen[r.Name]++
		}
		if len(seen) != 2 {
			t.Errorf("%s: answered by %v, want both endpoints", c.name, seen)
		}
	}

	// Without endpoints: rejected. The ICMP port unreachable is only a
	// soft error to SCTP (the INIT is retried until the connect times
	// out), so the checks are "no association" and the map element.
	if r, err := pod3.SCTP(netip.MustParseAddrPort("10.96.0.33:132"), wait); err == nil {
		t.Errorf("pod -> SCTP ClusterIP without endpoints: answered by %s, want no association", r.Name)
	}
	var out []byte
	if err := w.node.Do(func() (err error) {
		out, err = exec.Command("nft", "list", "map", "ip", TableName, "no-endpoint-services").Output()
		return err
	}); err != nil {
		t.Fatalf("nft list map: %v", err)
	}
	if want := "10.96.0.33 . sctp . 132 : goto reject-chain"; !strings.Contains(string(out), want) {
		t.Errorf("no-endpoint-services lacks %q:\n%s", want, out)
	}
}
