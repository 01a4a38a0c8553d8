package iptables

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"

	"github.com/edgeproxy/edgeproxy/datapath"
)

// nodePortIPs returns the node-port addresses of family fam: the node's
// own addresses (local lists them) inside the prefixes npa, plus, with
// primary, inside the node's primary addresses nodeIPs. Like kube-proxy, a
// family for which nothing restricts node ports gets nil: every local
// address. A non-nil empty result means no local address matched.
func nodePortIPs(fam datapath.Family, npa []netip.Prefix, primary bool, nodeIPs []netip.Addr, local func() ([]netip.Addr, error)) ([]netip.Addr, error) {
	var want []netip.Prefix
	for _, p := range npa {
		if datapath.FamilyOf(p.Addr()) == fam {
			want = append(want, p)
		}
	}
	if primary {
		for _, a := range nodeIPs {
			if a = a.Unmap(); datapath.FamilyOf(a) == fam && !a.IsLoopback() {
				want = append(want, netip.PrefixFrom(a, a.BitLen()))
			}
		}
	}
	if len(want) == 0 {
		return nil, nil
	}
	addrs, err := local()
	if err != nil {
		return nil, err
	}
	out := []netip.Addr{}
	for _, a := range addrs {
		a = a.Unmap()
		if datapath.FamilyOf(a) == fam && slices.ContainsFunc(want, func(p netip.Prefix) bool { return p.Contains(a) }) {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), nil
}

// localAddrs lists the addresses of the network namespace of the calling
// thread.
func localAddrs() ([]netip.Addr, error) {
	list, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("iptables: list local addresses: %w", err)
	}
	out := make([]netip.Addr, 0, len(list))
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}
