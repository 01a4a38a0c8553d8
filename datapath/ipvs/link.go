package ipvs

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// dummy is the link that holds every service address, so that the kernel
// treats them as local and IPVS sees the packets at LOCAL_IN. Its
// operations use the calling thread's network namespace.
type dummy struct{ name string }

// ensure creates the link if needed, brings it up and returns it.
func (d dummy) ensure() (netlink.Link, error) {
	l, err := netlink.LinkByName(d.name)
	if err == nil {
		if _, ok := l.(*netlink.Dummy); !ok {
			return nil, fmt.Errorf("ipvs: link %s exists and is a %s, not a dummy", d.name, l.Type())
		}
	} else {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return nil, fmt.Errorf("ipvs: look up link %s: %w", d.name, err)
		}
		if err := netlink.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: d.name}}); err != nil {
			return nil, fmt.Errorf("ipvs: create dummy link %s (module dummy loaded?): %w", d.name, err)
		}
		if l, err = netlink.LinkByName(d.name); err != nil {
			return nil, fmt.Errorf("ipvs: look up link %s: %w", d.name, err)
		}
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(l); err != nil {
			return nil, fmt.Errorf("ipvs: bring %s up: %w", d.name, err)
		}
	}
	return l, nil
}

// addresses returns the service addresses on the link (all but link-local
// ones); none when it is missing.
func (d dummy) addresses() (map[netip.Addr]bool, error) {
	out := map[netip.Addr]bool{}
	l, err := netlink.LinkByName(d.name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return out, nil
		}
		return nil, fmt.Errorf("ipvs: look up link %s: %w", d.name, err)
	}
	as, err := netlink.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("ipvs: list addresses of %s: %w", d.name, err)
	}
	for _, a := range as {
		// The kernel's own IPv6 link-local address is not ours to manage.
		if ip, ok := netip.AddrFromSlice(a.IP); ok && !ip.IsLinkLocalUnicast() {
			out[ip.Unmap()] = true
		}
	}
	return out, nil
}

// hostPrefix is a as a host route; an IPv6 one skips duplicate address
// detection, so that it is usable at once.
func hostPrefix(a netip.Addr) *netlink.Addr {
	na := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}}
	if a.Is6() {
		na.Flags = unix.IFA_F_NODAD
	}
	return na
}

// sync makes the link hold exactly want. It returns the number of changes.
func (d dummy) sync(want map[netip.Addr]bool) (int, error) {
	l, err := d.ensure()
	if err != nil {
		return 0, err
	}
	have, err := d.addresses()
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for a := range want {
		if have[a] {
			continue
		}
		if err := netlink.AddrAdd(l, hostPrefix(a)); err != nil {
			errs = append(errs, fmt.Errorf("ipvs: bind %s to %s: %w", a, d.name, err))
			continue
		}
		n++
	}
	for a := range have {
		if want[a] {
			continue
		}
		if err := netlink.AddrDel(l, hostPrefix(a)); err != nil {
			errs = append(errs, fmt.Errorf("ipvs: unbind %s from %s: %w", a, d.name, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// remove deletes the link if it exists.
func (d dummy) remove() error {
	l, err := netlink.LinkByName(d.name)
	if err != nil {
		return nil
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("ipvs: delete link %s: %w", d.name, err)
	}
	return nil
}

// kubeIPVSLink is kube-proxy's IPVS dummy link: its addresses are service
// addresses, not the node's, as kube-proxy counts them. It is there from a
// kube-proxy that edgeproxy replaces until the takeover removes it.
const kubeIPVSLink = "kube-ipvs0"

// nodeAddresses returns the IPv4 (and, with ipv6, IPv6) global unicast
// addresses on every link but the dummy and kube-proxy's kube-ipvs0: where
// NodePorts listen when none are configured.
func nodeAddresses(skip string, ipv6 bool) ([]netip.Addr, error) {
	fam := netlink.FAMILY_V4
	if ipv6 {
		fam = netlink.FAMILY_ALL
	}
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("ipvs: list links: %w", err)
	}
	var out []netip.Addr
	for _, l := range links {
		if l.Attrs().Name == skip || l.Attrs().Name == kubeIPVSLink {
			continue
		}
		as, err := netlink.AddrList(l, fam)
		if err != nil {
			return nil, fmt.Errorf("ipvs: list addresses of %s: %w", l.Attrs().Name, err)
		}
		for _, a := range as {
			// IsGlobalUnicast excludes loopback and link-local addresses.
			if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap().IsGlobalUnicast() {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}
