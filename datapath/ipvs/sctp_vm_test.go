package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/ipset"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
)

// TestSCTP: real SCTP associations through a ClusterIP (from a pod, source
// kept; from outside, masqueraded) and a NodePort (its set is hash:ip,port,
// as kube-proxy's); a service without endpoints makes none.
func TestSCTP(t *testing.T) {
	w := newWorld(t, "a", "c")
	gate.SCTP(t)
	if err := w.pods["a"].ServeSCTP(9132); err != nil {
		t.Fatal(err)
	}
	ep := datapath.Endpoint{Addr: w.pods["a"].AddrPort(9132), Weight: 1, Local: true}
	w.apply(w.p, &datapath.Plan{Full: true, Frontends: []datapath.Frontend{
		{Service: datapath.ServicePortName{Namespace: "default", Name: "sig", Port: "sctp"}, Kind: datapath.ClusterIP, Protocol: datapath.SCTP, Family: datapath.IPv4, Addr: addr("10.96.7.1"), Port: 132,
			Endpoints: []datapath.Endpoint{ep}},
		{Service: datapath.ServicePortName{Namespace: "default", Name: "sig", Port: "sctp"}, Kind: datapath.NodePort, Protocol: datapath.SCTP, Family: datapath.IPv4, Port: 30132,
			Endpoints: []datapath.Endpoint{ep}},
		{Service: datapath.ServicePortName{Namespace: "default", Name: "none", Port: "sctp"}, Kind: datapath.ClusterIP, Protocol: datapath.SCTP, Family: datapath.IPv4, Addr: addr("10.96.7.2"), Port: 132},
	}})
	if r, err := w.pods["c"].NS.SCTP(ap("10.96.7.1", 132), timeout); err != nil || r.Name != "a" || r.Client.Addr() != w.pods["c"].IP {
		t.Errorf("pod -> SCTP ClusterIP: %v %v, want a seeing %s", r, err, w.pods["c"].IP)
	}
	if r, err := w.client.SCTP(ap("10.96.7.1", 132), timeout); err != nil || r.Name != "a" {
		t.Errorf("outside client -> SCTP ClusterIP: %v %v, want a", r, err)
	} else if r.Client.Addr() == addr("192.168.77.2") {
		t.Errorf("outside client -> SCTP ClusterIP kept its source %s; want it masqueraded", r.Client)
	}
	np := netip.AddrPortFrom(w.node.LinkIP, 30132)
	if r, err := w.client.SCTP(np, timeout); err != nil || r.Name != "a" {
		t.Errorf("outside client -> SCTP NodePort %s: %v %v, want a", np, err, r)
	} else if r.Client.Addr() == addr("192.168.77.2") {
		t.Errorf("SCTP NodePort with policy Cluster kept the client's source %s", r.Client)
	}
	// Without endpoints: no association. The REJECT's ICMP port
	// unreachable is only a soft error to SCTP (the INIT is retried until
	// the connect times out), as with kube-proxy's endpoint-less virtual
	// servers.
	if r, err := w.pods["c"].NS.SCTP(ap("10.96.7.2", 132), timeout); err == nil {
		t.Errorf("SCTP service without endpoints: answered by %s, want no association", r.Name)
	}
	k := w.kernel()
	for _, key := range []Key{{addr("10.96.7.1"), datapath.SCTP, 132}, {w.node.LinkIP, datapath.SCTP, 30132}} {
		if v, ok := k[key]; !ok || len(v.Reals) != 1 {
			t.Errorf("kernel: %s: %+v", key, v)
		}
	}
	var entries []string
	if err := w.node.Do(func() error {
		s, es, ok, err := ipset.Netlink{}.Get(setNodePortPfx + "SCTP-HASH")
		if err == nil && (!ok || s.Type != ipset.HashIPPort) {
			err = fmt.Errorf("set %+v exists=%v", s, ok)
		}
		for _, e := range es {
			entries = append(entries, e.String())
		}
		return err
	}); err != nil || !slices.Contains(entries, w.node.LinkIP.String()+",sctp:30132") {
		t.Errorf("SCTP NodePort set: %v, entries %v; want %s,sctp:30132 among them", err, entries, w.node.LinkIP)
	}
}
