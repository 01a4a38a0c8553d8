package datapath

import (
	"net/netip"
	"slices"
)

// NodePortIPs returns the node-port addresses of family fam (config
// nodePortAddresses, kube-proxy --nodeport-addresses), for both modes: the
// node's own addresses (local lists them) inside the prefixes npa, plus,
// with primary (the keyword "primary"), the node's primary addresses
// nodeIPs. Like kube-proxy, a family for which nothing restricts node
// ports gets nil: every local address. A non-nil empty result means no
// local address matched.
func NodePortIPs(fam Family, npa []netip.Prefix, primary bool, nodeIPs []netip.Addr, local func() ([]netip.Addr, error)) ([]netip.Addr, error) {
	var want []netip.Prefix
	for _, p := range npa {
		if FamilyOf(p.Addr()) == fam {
			want = append(want, p)
		}
	}
	if primary {
		for _, a := range nodeIPs {
			if a = a.Unmap(); FamilyOf(a) == fam && !a.IsLoopback() {
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
		if FamilyOf(a) == fam && slices.ContainsFunc(want, func(p netip.Prefix) bool { return p.Contains(a) }) {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), nil
}
