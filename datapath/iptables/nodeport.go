package iptables

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
)

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
