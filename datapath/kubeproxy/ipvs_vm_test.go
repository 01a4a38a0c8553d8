package kubeproxy_test

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/ipset"
	"github.com/edgeproxy/edgeproxy/datapath/ipvs"
	"github.com/edgeproxy/edgeproxy/datapath/kubeproxy"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
	"github.com/edgeproxy/edgeproxy/internal/testkit/vm"
)

// TestIPVSLeftoversKernel lays out in a namespace what kube-proxy's IPVS
// mode leaves (kube-ipvs0 with service addresses, virtual servers on them
// and on a node address's NodePorts, its ipsets of both families), beside
// a virtual server edgeproxy adopted, one on edgeproxy's own dummy and a
// user's, then finds and removes kube-proxy's: only kube-proxy's go, and
// Claims says the same before. It needs IPVS and dummy links: the VM.
func TestIPVSLeftoversKernel(t *testing.T) {
	vm.Guest(t)
	gate.Root(t)
	ns := netns.New(t, "kp-ipvs")
	a := netip.MustParseAddr
	node, user := a("192.168.90.1"), a("192.0.2.50")
	vs := func(addr netip.Addr, p datapath.Protocol, port uint16) ipvs.VirtualServer {
		return ipvs.VirtualServer{Addr: addr, Protocol: p, Port: port, Scheduler: "rr"}
	}
	var (
		kpCluster = vs(a("10.96.0.10"), datapath.TCP, 53)
		adopted   = vs(a("10.96.0.10"), datapath.UDP, 53) // also on edgeproxy0: edgeproxy programs it
		kpExt     = vs(a("203.0.113.7"), datapath.TCP, 80)
		kpNode    = vs(node, datapath.TCP, 30080)
		ours      = vs(a("10.96.0.20"), datapath.TCP, 80) // on edgeproxy0 only
		userVS    = vs(user, datapath.TCP, 30080)         // a NodePort's port, not on a node address
		userNode  = vs(node, datapath.TCP, 8000)          // on a node address, no NodePort
	)
	all := []ipvs.VirtualServer{kpCluster, adopted, kpExt, kpNode, ours, userVS, userNode}
	v6set := "KUBE-6-LOAD-BALANCER-SOURCE-CID" // kube-proxy cuts its IPv6 names to 31 characters
	err := ns.Do(func() error {
		for name, addrs := range map[string][]netip.Addr{
			kubeproxy.KubeIPVSLink: {a("10.96.0.10"), a("203.0.113.7"), a("fd00:96::1")},
			"edgeproxy0":           {a("10.96.0.10"), a("10.96.0.20")},
			"eth9":                 {node},
		} {
			if err := netlink.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
				return err
			}
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			for _, ad := range addrs {
				if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: ad.AsSlice(), Mask: net.CIDRMask(ad.BitLen(), ad.BitLen())}}); err != nil {
					return err
				}
			}
		}
		k, err := ipvs.Open()
		if err != nil {
			return err
		}
		defer k.Close()
		for _, v := range all {
			if err := k.AddVirtualServer(v); err != nil {
				return err
			}
		}
		var sets ipset.Netlink
		for _, s := range []ipset.Set{
			{Name: "KUBE-NODE-PORT-TCP", Type: ipset.BitmapPort},
			{Name: "KUBE-CLUSTER-IP", Type: ipset.HashIPPort, Family: datapath.IPv4},
			{Name: "KUBE-6-CLUSTER-IP", Type: ipset.HashIPPort, Family: datapath.IPv6},
			{Name: v6set, Type: ipset.HashIPPortNet, Family: datapath.IPv6},
			{Name: "EP-CLUSTER-IP", Type: ipset.HashIPPort, Family: datapath.IPv4},
			{Name: "USER-SET", Type: ipset.HashIP, Family: datapath.IPv4},
		} {
			if err := sets.Create(s); err != nil {
				return err
			}
		}
		return sets.Add(ipset.Set{Name: "KUBE-NODE-PORT-TCP", Type: ipset.BitmapPort}, ipset.Entry{Port: 30080})
	})
	if err != nil {
		t.Fatalf("setting up kube-proxy's leftovers: %v", err)
	}

	keep := func(k ipvs.Key) bool { return k == adopted.Key() || k == ours.Key() }
	wantGone := []ipvs.Key{kpCluster.Key(), kpExt.Key(), kpNode.Key()}
	var found, removed kubeproxy.Report
	var left []ipvs.VirtualServer
	var sets []string
	var linkLeft bool
	err = ns.Do(func() error {
		claims, err := kubeproxy.Claims("edgeproxy0")
		if err != nil {
			return err
		}
		for _, v := range all {
			if got, want := claims(v.Key()), slices.Contains(wantGone, v.Key()) || v.Key() == adopted.Key(); got != want {
				t.Errorf("Claims(%s) = %t, want %t", v.Key(), got, want)
			}
		}
		// A dummy link of edgeproxy's own named kube-ipvs0 is not
		// kube-proxy's.
		if own, _ := kubeproxy.Claims(kubeproxy.KubeIPVSLink); own(kpCluster.Key()) || own(kpExt.Key()) {
			t.Errorf("Claims with edgeproxy's link named %s claims the link's virtual servers", kubeproxy.KubeIPVSLink)
		}
		if mine, err := kubeproxy.Find(context.Background(), kubeproxy.Options{Keep: keep, Link: kubeproxy.KubeIPVSLink}); err != nil || mine.Links() != 0 || mine.Servers() != 1 {
			t.Errorf("Find with edgeproxy's link named %s: %s (%v); want no link, only the NodePort's virtual server", kubeproxy.KubeIPVSLink, mine, err)
		}
		if found, err = kubeproxy.Find(context.Background(), kubeproxy.Options{Keep: keep, Link: "edgeproxy0"}); err != nil {
			return err
		}
		if removed, err = kubeproxy.Remove(context.Background(), kubeproxy.Options{Keep: keep, Link: "edgeproxy0"}); err != nil {
			return err
		}
		k, err := ipvs.Open()
		if err != nil {
			return err
		}
		defer k.Close()
		if left, err = k.VirtualServers(); err != nil {
			return err
		}
		_, err = netlink.LinkByName(kubeproxy.KubeIPVSLink)
		linkLeft = err == nil
		sets, err = ipset.Netlink{}.Names()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("found: %s; removed: %s", found, removed)
	if found.String() != removed.String() {
		t.Errorf("Find said %s, Remove removed %s", found, removed)
	}
	if removed.Servers() != 3 || removed.Links() != 1 || removed.Sets() != 4 {
		t.Errorf("removed %d virtual servers, %d links, %d sets; want 3, 1 (kube-ipvs0), 4 (KUBE-*, KUBE-6-*): %s",
			removed.Servers(), removed.Links(), removed.Sets(), removed)
	}
	var leftKeys []ipvs.Key
	for _, v := range left {
		leftKeys = append(leftKeys, v.Key())
	}
	for _, v := range all {
		if gone := !slices.Contains(leftKeys, v.Key()); gone != slices.Contains(wantGone, v.Key()) {
			t.Errorf("%s: removed %t, want %t", v.Key(), gone, !gone)
		}
	}
	if linkLeft {
		t.Errorf("%s left", kubeproxy.KubeIPVSLink)
	}
	slices.Sort(sets)
	if !slices.Equal(sets, []string{"EP-CLUSTER-IP", "USER-SET"}) {
		t.Errorf("ipsets left: %v, want EP-CLUSTER-IP USER-SET", sets)
	}
	// Nothing more to find; without kube-ipvs0 nothing is claimed.
	if err := ns.Do(func() error {
		again, err := kubeproxy.Find(context.Background(), kubeproxy.Options{Keep: keep})
		if again.Objects() != 0 {
			t.Errorf("found after Remove: %s", again)
		}
		claims, _ := kubeproxy.Claims("edgeproxy0")
		if claims(adopted.Key()) {
			t.Errorf("claimed without kube-ipvs0: %s", adopted.Key())
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}
