package nftables

import (
	"fmt"
	"slices"

	"github.com/google/nftables"
)

// hookNames are nft's words for the hooks of the ip, ip6 and inet
// families.
var hookNames = map[nftables.ChainHook]string{
	*nftables.ChainHookPrerouting:  "prerouting",
	*nftables.ChainHookInput:       "input",
	*nftables.ChainHookForward:     "forward",
	*nftables.ChainHookOutput:      "output",
	*nftables.ChainHookPostrouting: "postrouting",
}

// familyNames are nft's words for the families whose base chains see
// the traffic of our tables.
var familyNames = map[nftables.TableFamily]string{
	nftables.TableFamilyIPv4: "ip",
	nftables.TableFamilyIPv6: "ip6",
	nftables.TableFamilyINet: "inet",
}

// dropChains lists the base chains of other tables (ip, ip6 and inet,
// iptables-nft's included) whose policy is drop. Every base chain at a
// hook sees the packet: an accept in our table does not stop another
// table's chain from dropping it (nf_tables has no "final accept"
// across tables), so Services may be unreachable through them unless
// that table accepts the traffic itself, as kube-proxy's nftables mode
// documents (Docker's FORWARD policy drop, firewalld). A dump of chains,
// no rules; rules that drop are not looked at. iptables-legacy's
// chains are not nf_tables' and are not seen.
func (p *Proxier) dropChains() ([]string, error) {
	chains, err := p.conn.ListChains()
	if err != nil {
		return nil, fmt.Errorf("nftables: list chains: %w", err)
	}
	var out []string
	for _, c := range chains {
		if c.Hooknum == nil || c.Policy == nil || *c.Policy != nftables.ChainPolicyDrop || c.Table == nil {
			continue
		}
		fam, ok := familyNames[c.Table.Family]
		if !ok || (Ours(c.Table.Name) && fam != "inet") {
			continue
		}
		hook := hookNames[*c.Hooknum]
		if hook == "" {
			hook = fmt.Sprintf("hook %d", *c.Hooknum)
		}
		prio := 0
		if c.Priority != nil {
			prio = int(*c.Priority)
		}
		out = append(out, fmt.Sprintf("table %s %s chain %s (%s, priority %d) has policy drop: traffic edgeproxy accepts is dropped there unless that table accepts it",
			fam, c.Table.Name, c.Name, hook, prio))
	}
	slices.Sort(out)
	return out, nil
}
