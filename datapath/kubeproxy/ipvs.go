package kubeproxy

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/ipset"
	"github.com/edgeproxy/edgeproxy/datapath/ipvs"
)

// What kube-proxy's IPVS mode leaves besides its iptables chains, learnt
// from kube-proxy v1.36 (pkg/proxy/ipvs: the dummy device, ipsetInfo, and
// the virtual servers syncService makes for ClusterIPs, externalIPs,
// LoadBalancer IPs and NodePorts). kube-proxy's own cleanup flushes every
// IPVS virtual server of the node; edgeproxy removes only kube-proxy's.

// KubeIPVSLink is the dummy link kube-proxy's IPVS mode binds the
// service addresses it serves to.
const KubeIPVSLink = "kube-ipvs0"

// kubeSets are the ipsets of kube-proxy's IPVS mode (ipsetInfo). Its IPv6
// proxier names its sets with "KUBE-6-" for "KUBE-", cut to the kernel's
// 31 characters (NewIPSet): see v6Name.
var kubeSets = []string{
	"KUBE-LOOP-BACK", "KUBE-CLUSTER-IP", "KUBE-EXTERNAL-IP", "KUBE-EXTERNAL-IP-LOCAL",
	"KUBE-LOAD-BALANCER", "KUBE-LOAD-BALANCER-FW", "KUBE-LOAD-BALANCER-LOCAL",
	"KUBE-LOAD-BALANCER-SOURCE-IP", "KUBE-LOAD-BALANCER-SOURCE-CIDR",
	"KUBE-NODE-PORT-TCP", "KUBE-NODE-PORT-LOCAL-TCP", "KUBE-NODE-PORT-UDP", "KUBE-NODE-PORT-LOCAL-UDP",
	"KUBE-NODE-PORT-SCTP-HASH", "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
	"KUBE-HEALTH-CHECK-NODE-PORT", "KUBE-IPVS-IPS",
}

// KubeSetNames are kube-proxy's ipset names of both families.
func KubeSetNames() []string {
	out := slices.Clone(kubeSets)
	for _, s := range kubeSets {
		out = append(out, v6Name(s))
	}
	return out
}

// v6Name is the name kube-proxy's IPv6 proxier gives set name.
func v6Name(name string) string {
	name = strings.Replace(name, "KUBE-", "KUBE-6-", 1)
	return name[:min(len(name), ipset.MaxNameLen)]
}

// nodePortSets are the sets holding the NodePorts kube-proxy serves, by
// protocol: bitmap:port sets of ports (TCP, UDP) and hash:ip,port sets
// of node address and port (SCTP), all and externalTrafficPolicy Local.
var nodePortSets = map[datapath.Protocol][]string{
	datapath.TCP:  {"KUBE-NODE-PORT-TCP", "KUBE-NODE-PORT-LOCAL-TCP"},
	datapath.UDP:  {"KUBE-NODE-PORT-UDP", "KUBE-NODE-PORT-LOCAL-UDP"},
	datapath.SCTP: {"KUBE-NODE-PORT-SCTP-HASH", "KUBE-NODE-PORT-LOCAL-SCTP-HASH"},
}

// NodePorts are the NodePorts kube-proxy's IPVS mode served, read from
// its sets: a port per protocol (TCP, UDP; one set for both families) and
// address:port pairs (SCTP).
type NodePorts struct {
	Ports map[datapath.Protocol]map[uint16]bool
	SCTP  map[netip.AddrPort]bool
}

func (n *NodePorts) add(p datapath.Protocol, e ipset.Entry) {
	if p == datapath.SCTP {
		if n.SCTP == nil {
			n.SCTP = map[netip.AddrPort]bool{}
		}
		n.SCTP[netip.AddrPortFrom(e.Addr, e.Port)] = true
		return
	}
	if n.Ports == nil {
		n.Ports = map[datapath.Protocol]map[uint16]bool{}
	}
	if n.Ports[p] == nil {
		n.Ports[p] = map[uint16]bool{}
	}
	n.Ports[p][e.Port] = true
}

func (n NodePorts) has(k ipvs.Key) bool {
	if k.Protocol == datapath.SCTP {
		return n.SCTP[netip.AddrPortFrom(k.Addr, k.Port)]
	}
	return n.Ports[k.Protocol][k.Port]
}

// KubeServers picks, of the node's virtual servers, those kube-proxy made:
//
//   - one on an address bound to kube-ipvs0 (linkAddrs): kube-proxy binds
//     there every ClusterIP, externalIP and LoadBalancer IP it serves, and
//     nothing else uses that link;
//   - one on a node address (nodeAddrs: the node's addresses on its other
//     links) whose protocol and port are a NodePort in kube-proxy's sets
//     (KUBE-NODE-PORT-*): its NodePorts, which it serves on node addresses.
//
// keep says which virtual servers edgeproxy programs (it adopts kube-proxy's
// when the key is the same): those are never picked. A virtual server of
// someone else (keepalived's on a VIP, a fwmark service, one on a port no
// kube-proxy set holds) matches neither rule and stays.
func KubeServers(vss []ipvs.VirtualServer, linkAddrs, nodeAddrs map[netip.Addr]bool, np NodePorts, keep func(ipvs.Key) bool) []ipvs.VirtualServer {
	var out []ipvs.VirtualServer
	for _, v := range vss {
		k := v.Key()
		if keep != nil && keep(k) {
			continue
		}
		if claimed(k, linkAddrs, nodeAddrs, np) {
			out = append(out, v)
		}
	}
	return out
}

func claimed(k ipvs.Key, linkAddrs, nodeAddrs map[netip.Addr]bool, np NodePorts) bool {
	return linkAddrs[k.Addr] || (nodeAddrs[k.Addr] && np.has(k))
}

// Claims reads kube-ipvs0, the node's addresses and kube-proxy's NodePort
// sets once, in the calling thread's network namespace, and returns
// whether a virtual server is kube-proxy's by KubeServers' rules: what
// `edgeproxy cleanup` leaves on the way back to kube-proxy, when kube-proxy
// runs again (and programs the same keys) before the cleanup. Without
// kube-ipvs0 (or when own, edgeproxy's dummy link, is named kube-ipvs0)
// nothing is kube-proxy's.
func Claims(own string) (func(ipvs.Key) bool, error) {
	linkAddrs, link, err := kubeLinkAddrs(own)
	if err != nil || link == nil {
		return func(ipvs.Key) bool { return false }, err
	}
	nodeAddrs, err1 := nodeAddresses()
	np, _, err2 := readKubeSets()
	return func(k ipvs.Key) bool { return claimed(k, linkAddrs, nodeAddrs, np) }, errors.Join(err1, err2)
}

// ipvsLeftovers finds (and removes) what kube-proxy's IPVS mode left: its
// virtual servers, kube-ipvs0 and its ipsets, in the calling thread's
// network namespace. The iptables chains that refer to the sets must be
// gone first. A node whose kernel has no IPVS loaded (/proc/net/ip_vs)
// never ran it: nothing is opened, and no module is loaded by asking.
func ipvsLeftovers(remove bool, keep func(ipvs.Key) bool, own string) (Report, error) {
	if _, err := os.Stat("/proc/net/ip_vs"); err != nil {
		return nil, nil
	}
	var rep Report
	var errs []error
	linkAddrs, link, err := kubeLinkAddrs(own)
	if err != nil {
		errs = append(errs, err)
	}
	nodeAddrs, err := nodeAddresses()
	if err != nil {
		errs = append(errs, err)
	}
	np, present, err := readKubeSets()
	if err != nil {
		errs = append(errs, err)
	}
	// Virtual servers.
	if k, err := ipvs.Open(); err != nil {
		errs = append(errs, fmt.Errorf("kubeproxy: %w", err))
	} else {
		defer k.Close()
		vss, err := k.VirtualServers()
		if err != nil {
			errs = append(errs, fmt.Errorf("kubeproxy: %w", err))
		}
		theirs := KubeServers(vss, linkAddrs, nodeAddrs, np, keep)
		n := 0
		for _, v := range theirs {
			if remove {
				if err := k.DeleteVirtualServer(v); err != nil {
					errs = append(errs, fmt.Errorf("kubeproxy: %w", err))
					continue
				}
			}
			n++
		}
		if n > 0 {
			rep = append(rep, Found{Where: "IPVS", Servers: n})
		}
	}
	// The dummy link, with the addresses still bound to it.
	if link != nil {
		if remove {
			if err := netlink.LinkDel(link); err != nil {
				errs = append(errs, fmt.Errorf("kubeproxy: delete link %s: %w", KubeIPVSLink, err))
				link = nil
			}
		}
		if link != nil {
			rep = append(rep, Found{Where: "link " + KubeIPVSLink, Addresses: len(linkAddrs)})
		}
	}
	// The sets, once nothing refers to them.
	n := 0
	var inUse []string
	for _, name := range present {
		if remove {
			if err := ipset.Destroy(ipset.Netlink{}, name); err != nil {
				if errors.Is(err, ipset.ErrInUse) {
					inUse = append(inUse, name)
					continue
				}
				errs = append(errs, fmt.Errorf("kubeproxy: %w", err))
				continue
			}
		}
		n++
	}
	if n > 0 || len(inUse) > 0 {
		rep = append(rep, Found{Where: "ipset", Sets: n, Kept: inUse})
	}
	return rep, errors.Join(errs...)
}

// kubeLinkAddrs returns kube-ipvs0 (nil when there is none, it is not a
// dummy, or it is edgeproxy's own: own, ipvs.interface, names it) and the
// addresses bound to it.
func kubeLinkAddrs(own string) (map[netip.Addr]bool, netlink.Link, error) {
	out := map[netip.Addr]bool{}
	if own == KubeIPVSLink {
		return out, nil, nil
	}
	l, err := netlink.LinkByName(KubeIPVSLink)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return out, nil, nil
		}
		return out, nil, fmt.Errorf("kubeproxy: look up link %s: %w", KubeIPVSLink, err)
	}
	if l.Type() != "dummy" {
		return out, nil, nil
	}
	as, err := netlink.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return out, l, fmt.Errorf("kubeproxy: addresses of %s: %w", KubeIPVSLink, err)
	}
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && !ip.IsLinkLocalUnicast() {
			out[ip.Unmap()] = true
		}
	}
	return out, l, nil
}

// nodeAddresses are the addresses on every link but kube-ipvs0.
func nodeAddresses() (map[netip.Addr]bool, error) {
	out := map[netip.Addr]bool{}
	links, err := netlink.LinkList()
	if err != nil {
		return out, fmt.Errorf("kubeproxy: list links: %w", err)
	}
	for _, l := range links {
		if l.Attrs().Name == KubeIPVSLink {
			continue
		}
		as, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return out, fmt.Errorf("kubeproxy: addresses of %s: %w", l.Attrs().Name, err)
		}
		for _, a := range as {
			if ip, ok := netip.AddrFromSlice(a.IP); ok {
				out[ip.Unmap()] = true
			}
		}
	}
	return out, nil
}

// readKubeSets returns the NodePorts in kube-proxy's sets and the names of
// its sets that exist.
func readKubeSets() (NodePorts, []string, error) {
	var np NodePorts
	var present []string
	names, err := ipset.Netlink{}.Names()
	if err != nil {
		return np, nil, fmt.Errorf("kubeproxy: %w", err)
	}
	mine := KubeSetNames()
	for _, name := range names {
		if slices.Contains(mine, name) {
			present = append(present, name)
		}
	}
	var errs []error
	for proto, sets := range nodePortSets {
		for _, s := range sets {
			for _, name := range []string{s, v6Name(s)} {
				if !slices.Contains(present, name) {
					continue
				}
				_, entries, _, err := ipset.Netlink{}.Get(name)
				if err != nil {
					errs = append(errs, fmt.Errorf("kubeproxy: %w", err))
					continue
				}
				for _, e := range entries {
					np.add(proto, e)
				}
			}
		}
	}
	return np, present, errors.Join(errs...)
}
