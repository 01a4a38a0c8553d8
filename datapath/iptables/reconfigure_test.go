package iptables_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/iptables"
)

// TestReconfigure: settings changed while the proxier runs (a config
// reload) are in the rules after the next apply, even one whose plan
// changes nothing, and real packets follow them; a bad value changes
// nothing.
func TestReconfigure(t *testing.T) {
	eachVariant(t, func(t *testing.T, v iptables.Variant) {
		e := newEnv(t, v, 2, nil)
		a, b := e.pods[0], e.pods[1]
		fs := []datapath.Frontend{
			fe("default/web:", datapath.ClusterIP, datapath.TCP, vip, 80, e.ep(0, 1)),
			fe("default/web:", datapath.NodePort, datapath.TCP, netip.Addr{}, 30080, e.ep(0, 1)),
		}
		e.mustApply(&datapath.Plan{Full: true, Frontends: fs})
		nothingChanged := func() *datapath.Plan {
			return &datapath.Plan{Changed: map[datapath.ServicePortName]bool{}, Frontends: fs}
		}
		reconfigure := func(o iptables.Options) error {
			return e.node.Do(func() error { return e.p.Reconfigure(o) })
		}
		r, err := b.TCP(ap(vip, 80), waitResp)
		expect(t, "pod b -> ClusterIP, b in clusterCIDR", r, err, "a", b.IP)
		r, err = e.client.TCP(ap(e.node.LinkIP, 30080), waitResp)
		expect(t, "client -> NodePort", r, err, "a", e.node.Gateway)

		// masqueradeAll, another mark bit, node ports on no address of the
		// node's.
		if err := reconfigure(iptables.Options{MasqueradeBit: 12, MasqueradeAll: true, LocalhostNodePorts: true,
			ClusterCIDRs: []netip.Prefix{clusterCIDR}, NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("10.99.0.0/16")}}); err != nil {
			t.Fatal(err)
		}
		e.mustApply(nothingChanged())
		if save := e.save(); !strings.Contains(save, "0x1000/0x1000") || strings.Contains(save, "0x4000") {
			t.Fatalf("rules after masqueradeBit 14 -> 12: want mark 0x1000 only:\n%s", save)
		}
		r, err = b.TCP(ap(vip, 80), waitResp)
		expect(t, "pod b -> ClusterIP with masqueradeAll", r, err, "a", e.node.Gateway)
		if r, err := e.client.TCP(ap(e.node.LinkIP, 30080), waitDrop); err == nil {
			t.Fatalf("client -> NodePort outside nodePortAddresses answered by %s", r.Name)
		}

		// A bad value changes nothing.
		before := e.save()
		if err := reconfigure(iptables.Options{MasqueradeBit: 40}); err == nil {
			t.Fatal("masquerade bit 40 accepted")
		}
		e.mustApply(nothingChanged())
		if after := e.save(); after != before {
			t.Fatalf("a refused reconfigure changed the rules:\n--- before\n%s\n--- after\n%s", before, after)
		}

		// A clusterCIDR that b is not in: b is masqueraded without
		// masqueradeAll; back in it, it is not, and node ports are back.
		if err := reconfigure(iptables.Options{MasqueradeBit: 14, LocalhostNodePorts: true,
			ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.250.0.0/16")}}); err != nil {
			t.Fatal(err)
		}
		e.mustApply(nothingChanged())
		r, err = b.TCP(ap(vip, 80), waitResp)
		expect(t, "pod b -> ClusterIP, b outside clusterCIDR", r, err, "a", e.node.Gateway)
		if err := reconfigure(iptables.Options{MasqueradeBit: 14, LocalhostNodePorts: true, ClusterCIDRs: []netip.Prefix{clusterCIDR}}); err != nil {
			t.Fatal(err)
		}
		e.mustApply(nothingChanged())
		r, err = b.TCP(ap(vip, 80), waitResp)
		expect(t, "pod b -> ClusterIP, b in clusterCIDR again", r, err, "a", b.IP)
		r, err = e.client.TCP(ap(e.node.LinkIP, 30080), waitResp)
		expect(t, "client -> NodePort, nodePortAddresses back to every address", r, err, "a", e.node.Gateway)
		_ = a
	})
}
