package proxies

import (
	"fmt"

	"github.com/vishvananda/netlink"

	"github.com/edgeproxy/edgeproxy/datapath/ipvs"
)

// ipvsSysctls are the IPVS-mode sysctls kube-proxy sets, at the kernel's
// defaults: each proxy must set what it relies on itself.
var ipvsSysctls = []string{
	"net.ipv4.vs.conntrack=0",
	"net.ipv4.vs.expire_nodest_conn=0",
	"net.ipv4.vs.expire_quiescent_template=0",
	"net.ipv4.vs.conn_reuse_mode=1",
}

// ResetIPVS is Reset for IPVS mode: it also deletes every IPVS virtual
// server, every dummy link (kube-proxy's kube-ipvs0, edgeproxy's
// ipvs.interface) and every ipset of the node namespace, and puts the IPVS
// sysctls back. do runs a function on a thread inside the namespace
// (netns.NS.Do); run runs a command there.
func ResetIPVS(do func(func() error) error, run Runner) error {
	if err := Reset(run); err != nil {
		return err
	}
	err := do(func() error {
		k, err := ipvs.Open()
		if err != nil {
			return err
		}
		defer k.Close()
		vss, err := k.VirtualServers()
		if err != nil {
			return err
		}
		for _, v := range vss {
			if err := k.DeleteVirtualServer(v); err != nil {
				return err
			}
		}
		links, err := netlink.LinkList()
		if err != nil {
			return fmt.Errorf("list links: %w", err)
		}
		for _, l := range links {
			if l.Type() != "dummy" {
				continue
			}
			if err := netlink.LinkDel(l); err != nil {
				return fmt.Errorf("delete link %s: %w", l.Attrs().Name, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("proxies: reset ipvs: %w", err)
	}
	// The sets are unreferenced once the rules are gone.
	if _, err := run("ipset", "destroy"); err != nil {
		return fmt.Errorf("proxies: reset ipvs: %w", err)
	}
	for _, kv := range ipvsSysctls {
		if _, err := run("sysctl", "-qw", kv); err != nil {
			return fmt.Errorf("proxies: reset ipvs: %w", err)
		}
	}
	return nil
}
