package fault

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/iptables"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// refusingCleaner stands in for a conntrack table the kernel will not
// dump or clean (full, busy): every Reconcile fails.
type refusingCleaner struct{ calls int }

func (c *refusingCleaner) Reconcile(context.Context, []datapath.Frontend, bool) (int, error) {
	c.calls++
	return 0, errors.New("conntrack: dump: no buffer space available")
}

// A conntrack cleanup that fails does not fail the apply: the rules are
// programmed and answer, and the next apply tries the cleanup again.
// (nf_conntrack_max cannot be lowered inside a network namespace on this
// kernel, and lowering the host's would break the shared machine, so the
// cleaner's failure is injected; see docs/reliability.md.)
func TestConntrackCleanupFailureIsNotFatal(t *testing.T) {
	gate.Root(t)
	gate.Binaries(t, "iptables", "iptables-restore", "iptables-save")
	node := netns.NewNode(t, "ctfull")
	client := node.AddClient("client")
	a := node.AddPod("a")
	if err := a.Serve(podPort); err != nil {
		t.Fatal(err)
	}
	ct := &refusingCleaner{}
	var p *iptables.Proxier
	if err := node.Do(func() (err error) {
		p, err = iptables.New(iptables.Options{MasqueradeBit: 14, Conntrack: ct})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		plan := &datapath.Plan{Full: i == 0, Changed: map[datapath.ServicePortName]bool{{Namespace: "t", Name: "dns", Port: "dns"}: true}, Frontends: []datapath.Frontend{
			{Service: datapath.ServicePortName{Namespace: "t", Name: "dns", Port: "dns"}, Kind: datapath.ClusterIP, Protocol: datapath.UDP, Addr: vip, Family: datapath.IPv4, Port: 53,
				Endpoints: []datapath.Endpoint{{Addr: a.AddrPort(podPort), Weight: 1, Local: true}}},
			{Service: datapath.ServicePortName{Namespace: "t", Name: "web", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: vip, Family: datapath.IPv4, Port: 80,
				Endpoints: []datapath.Endpoint{{Addr: a.AddrPort(podPort), Weight: 1, Local: true}}},
		}}
		if err := node.Do(func() error { return p.Apply(context.Background(), plan) }); err != nil {
			t.Fatalf("apply %d failed because the conntrack cleanup did: %v", i, err)
		}
	}
	if ct.calls != 2 {
		t.Errorf("conntrack cleanup tried %d times in 2 applies, want 2", ct.calls)
	}
	r, err := client.TCP(netip.AddrPortFrom(vip, 80), 2*time.Second)
	if err != nil || r.Name != "a" {
		t.Fatalf("the Service answered %q (err %v), want pod a", r.Name, err)
	}
}
