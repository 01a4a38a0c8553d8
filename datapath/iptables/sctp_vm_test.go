package iptables_test

import (
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/iptables"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/vm"
)

// TestSCTP: real SCTP associations through a ClusterIP (from a pod, source
// kept; from the outside client, masqueraded: it is outside the cluster
// CIDR) and a NodePort; a service without endpoints gets kube-proxy's
// REJECT and makes no association. The host kernel has no SCTP, so it
// runs in the VM (test/vm's TestGuestPackages, -test.run=SCTP).
func TestSCTP(t *testing.T) {
	vm.Guest(t)
	gate.SCTP(t)
	eachVariant(t, func(t *testing.T, v iptables.Variant) {
		e := newEnv(t, v, 2, nil)
		a, b := e.pods[0], e.pods[1]
		if err := a.ServeSCTP(podPort); err != nil {
			t.Fatal(err)
		}
		e.mustApply(&datapath.Plan{Full: true, Frontends: []datapath.Frontend{
			fe("default/sig:sctp", datapath.ClusterIP, datapath.SCTP, vip, 132, e.ep(0, 1)),
			fe("default/sig:sctp", datapath.NodePort, datapath.SCTP, netip.Addr{}, 30132, e.ep(0, 1)),
			fe("default/none:sctp", datapath.ClusterIP, datapath.SCTP, vip2, 132),
		}})

		r, err := b.SCTP(ap(vip, 132), waitResp)
		expect(t, "pod b -> SCTP ClusterIP", r, err, "a", b.IP)
		r, err = e.client.SCTP(ap(vip, 132), waitResp)
		expect(t, "client -> SCTP ClusterIP", r, err, "a", e.node.Gateway)
		r, err = e.client.SCTP(ap(e.node.LinkIP, 30132), waitResp)
		expect(t, "client -> SCTP NodePort", r, err, "a", e.node.Gateway)

		// Without endpoints: REJECT, as kube-proxy. Its ICMP port
		// unreachable is only a soft error to SCTP (the INIT is retried
		// until the connect times out), so the check is "no association"
		// and the rule itself.
		if r, err := b.SCTP(ap(vip2, 132), waitDrop); err == nil {
			t.Errorf("pod b -> SCTP ClusterIP without endpoints: answered by %s, want no association", r.Name)
		}
		// Standard output only: iptables-nft warns on standard error
		// that legacy tables exist, and the two may interleave.
		var filter []byte
		if err := e.node.Do(func() (err error) {
			filter, err = exec.Command("iptables-"+string(v)+"-save", "-t", "filter").Output()
			return err
		}); err != nil {
			t.Fatalf("iptables-%s-save: %v", v, err)
		}
		want := "-d " + vip2.String() + "/32 -p sctp -m sctp --dport 132"
		var rejected bool
		for _, l := range strings.Split(string(filter), "\n") {
			rejected = rejected || strings.Contains(l, want) && strings.Contains(l, "-j REJECT")
		}
		if !rejected {
			t.Errorf("no REJECT rule with %q for the SCTP service without endpoints", want)
		}
	})
}
