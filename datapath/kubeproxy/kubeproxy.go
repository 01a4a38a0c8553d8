// Package kubeproxy finds and removes what kube-proxy left in the kernel
// when edgeproxy replaces it on a live node: its iptables chains and the
// jumps to them (under iptables-legacy and iptables-nft, both families,
// from its iptables and IPVS modes), its nftables tables ("ip
// kube-proxy", "ip6 kube-proxy"), and what its IPVS mode adds: its IPVS
// virtual servers (KubeServers says which), the kube-ipvs0 dummy link and
// its ipsets (KUBE-*, KUBE-6-*).
//
// Which chains are kube-proxy's is learnt from kube-proxy v1.36's own
// cleanup (pkg/proxy/iptables CleanupLeftovers and isServiceChainName,
// pkg/proxy/ipvs iptablesChains, ipsetInfo and CleanupLeftovers,
// pkg/proxy/nftables CleanupLeftovers).
// The chains kubelet owns (KUBE-FIREWALL, KUBE-KUBELET-CANARY,
// KUBE-IPTABLES-HINT, KUBE-MARK-DROP) are never touched.
//
// The agent calls Remove once, after its own first successful sync, so
// that its rules are in place before kube-proxy's go: no new connection
// meets a node without Service rules. The nftables tables, IPVS objects
// and ipsets are found and deleted over netlink: no nft, ipvsadm or ipset
// program is needed.
package kubeproxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/ipvs"
	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// fixedChains are kube-proxy's chains of constant name, per table (its
// iptables and IPVS modes).
var fixedChains = map[string][]string{
	xtables.NAT: {"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ",
		"KUBE-PROXY-CANARY", "KUBE-NODE-PORT", "KUBE-LOAD-BALANCER"},
	xtables.Filter: {"KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-NODEPORTS",
		"KUBE-PROXY-FIREWALL", "KUBE-PROXY-CANARY", "KUBE-NODE-PORT", "KUBE-SOURCE-RANGES-FIREWALL",
		"KUBE-IPVS-FILTER", "KUBE-IPVS-OUT-FILTER"},
	xtables.Mangle: {"KUBE-PROXY-CANARY"},
}

// servicePrefixes start the names of kube-proxy's per-service chains
// (nat table, iptables mode).
var servicePrefixes = []string{"KUBE-SVC-", "KUBE-SVL-", "KUBE-SEP-", "KUBE-FW-", "KUBE-EXT-"}

// Tables are the iptables tables kube-proxy writes to.
var Tables = []string{xtables.NAT, xtables.Filter, xtables.Mangle}

// Owned reports whether chain in table is kube-proxy's. kubelet's chains
// (KUBE-FIREWALL, KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT, KUBE-MARK-DROP)
// are not.
func Owned(table, chain string) bool {
	if slices.Contains(fixedChains[table], chain) {
		return true
	}
	if table != xtables.NAT {
		return false
	}
	for _, p := range servicePrefixes {
		if strings.HasPrefix(chain, p) {
			return true
		}
	}
	return false
}

// Found is what kube-proxy left in one place: an iptables table of one
// backend and family, one nftables table, IPVS ("IPVS": its virtual
// servers), its dummy link ("link kube-ipvs0") or its ipsets ("ipset").
type Found struct {
	Where  string `json:"where"`            // "iptables-nft IPv4 nat", "nftables ip kube-proxy", "IPVS", "link kube-ipvs0", "ipset"
	Chains int    `json:"chains,omitempty"` // kube-proxy's chains (nftables: the table's chains, sets and maps)
	Jumps  int    `json:"jumps,omitempty"`  // rules in other chains that jump to them
	// Servers are IPVS virtual servers, Addresses those bound to
	// kube-ipvs0 (the link goes with them), Sets ipsets.
	Servers   int `json:"servers,omitempty"`
	Addresses int `json:"addresses,omitempty"`
	Sets      int `json:"sets,omitempty"`
	// Kept are chains left because a chain that is not kube-proxy's
	// jumps to them (directly or through another kept one); sets left
	// because a rule that is not kube-proxy's refers to them.
	Kept []string `json:"kept,omitempty"`
}

// Report lists what was found, or removed.
type Report []Found

// Chains is the number of chains in r.
func (r Report) Chains() int {
	n := 0
	for _, f := range r {
		n += f.Chains
	}
	return n
}

// Jumps is the number of jump rules in r.
func (r Report) Jumps() int {
	n := 0
	for _, f := range r {
		n += f.Jumps
	}
	return n
}

// Servers is the number of IPVS virtual servers in r.
func (r Report) Servers() int {
	n := 0
	for _, f := range r {
		n += f.Servers
	}
	return n
}

// Links is the number of dummy links (kube-ipvs0) in r.
func (r Report) Links() int {
	n := 0
	for _, f := range r {
		if strings.HasPrefix(f.Where, "link ") {
			n++
		}
	}
	return n
}

// Sets is the number of ipsets in r.
func (r Report) Sets() int {
	n := 0
	for _, f := range r {
		n += f.Sets
	}
	return n
}

// Objects is the number of kube-proxy's objects in r: chains, IPVS
// virtual servers, links and ipsets.
func (r Report) Objects() int { return r.Chains() + r.Servers() + r.Links() + r.Sets() }

// String is r on one line, for logs.
func (r Report) String() string {
	if len(r) == 0 {
		return "nothing"
	}
	parts := make([]string, len(r))
	for i, f := range r {
		switch {
		case strings.HasPrefix(f.Where, "nftables"):
			parts[i] = fmt.Sprintf("%s: %d chains, sets and maps", f.Where, f.Chains)
			continue
		case f.Where == "IPVS":
			parts[i] = fmt.Sprintf("IPVS: %d virtual servers", f.Servers)
			continue
		case strings.HasPrefix(f.Where, "link "):
			parts[i] = fmt.Sprintf("%s: %d addresses", f.Where, f.Addresses)
			continue
		case f.Where == "ipset":
			parts[i] = fmt.Sprintf("ipset: %d sets", f.Sets)
			if len(f.Kept) > 0 {
				parts[i] += fmt.Sprintf(" (kept %s, in use)", strings.Join(f.Kept, " "))
			}
			continue
		}
		parts[i] = fmt.Sprintf("%s: %d chains, %d jumps", f.Where, f.Chains, f.Jumps)
		if len(f.Kept) > 0 {
			parts[i] += fmt.Sprintf(" (kept %s)", strings.Join(f.Kept, " "))
		}
	}
	return strings.Join(parts, "; ")
}

// Options tune Find and Remove; the zero value is fine.
type Options struct {
	Wait   time.Duration // for the xtables lock; xtables.DefaultWait when 0
	Logger *slog.Logger
	// Keep names the IPVS virtual servers edgeproxy programs (IPVS mode
	// adopts kube-proxy's of the same key): never removed. Nil: none.
	Keep func(ipvs.Key) bool
	// Link is edgeproxy's own IPVS dummy link (ipvs.interface): a link
	// of that name is never kube-proxy's, even when it is kube-ipvs0.
	Link string
}

// Find reports what kube-proxy left, without changing anything.
func Find(ctx context.Context, o Options) (Report, error) { return walk(ctx, o, false) }

// Remove removes what kube-proxy left and reports what it removed. Per
// iptables table it is one iptables-restore: the jumps to kube-proxy's
// chains are deleted, then the chains emptied and deleted, committed
// together. Each nftables table is deleted whole. Then kube-proxy's IPVS
// virtual servers (not o.Keep's), kube-ipvs0, and its ipsets, which only
// the removed chains referred to. An error in one place does not stop
// the others.
func Remove(ctx context.Context, o Options) (Report, error) { return walk(ctx, o, true) }

func walk(ctx context.Context, o Options, remove bool) (Report, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	var rep Report
	var errs []error
	for _, v := range []xtables.Variant{xtables.Legacy, xtables.NFT} {
		for _, fam := range []datapath.Family{datapath.IPv4, datapath.IPv6} {
			t, err := xtables.Open(v, fam, o.Wait)
			if err != nil {
				var ee *exec.Error
				if !errors.As(err, &ee) {
					errs = append(errs, err)
				}
				continue // not installed: it holds nothing
			}
			// One listing of every table per tool: under an emulated
			// CPU each run of iptables-save costs a second.
			saved, err := t.SaveTable(ctx, "")
			if err != nil {
				errs = append(errs, fmt.Errorf("kubeproxy: iptables-%s IPv%d: %w", t.Variant, t.Family, err))
				continue
			}
			for _, table := range Tables {
				f, err := iptablesTable(ctx, t, table, saved, remove)
				if err != nil {
					errs = append(errs, err)
				}
				if f.Chains > 0 || f.Jumps > 0 {
					rep = append(rep, f)
				}
			}
		}
	}
	found, err := nftTables(remove)
	rep = append(rep, found...)
	if err != nil {
		errs = append(errs, err)
	}
	found, err = ipvsLeftovers(remove, o.Keep, o.Link)
	rep = append(rep, found...)
	if err != nil {
		errs = append(errs, err)
	}
	return rep, errors.Join(errs...)
}

// iptablesTable finds (and removes) kube-proxy's objects in one table of
// saved, the tool's iptables-save listing of every table (a table that
// does not exist is not in it, and holds nothing).
func iptablesTable(ctx context.Context, t *xtables.Tool, table, saved string, remove bool) (Found, error) {
	f := Found{Where: fmt.Sprintf("iptables-%s IPv%d %s", t.Variant, t.Family, table)}
	input, p := Plan(table, saved)
	f.Chains, f.Jumps, f.Kept = len(p.Chains), p.Jumps, p.Kept
	if !remove || input == nil {
		return f, nil
	}
	if err := t.RestoreNoFlush(ctx, input); err != nil {
		return f, fmt.Errorf("kubeproxy: remove from %s: %w", f.Where, err)
	}
	return f, nil
}

// Removal is what Plan removes from one table.
type Removal struct {
	Chains []string // kube-proxy's chains to delete
	Jumps  int      // rules of other chains that jump to them
	Kept   []string // kube-proxy's chains a foreign chain still jumps to
}

// Plan reads one table's iptables-save listing and returns the
// iptables-restore --noflush input that removes kube-proxy's objects
// from it (nil when there are none): every rule of another chain that
// jumps to one of them is deleted (-D, with the rule as listed), then
// the chains are emptied and deleted. A chain that a foreign chain (not
// built in, not kube-proxy's) jumps to is kept, with every chain it
// reaches, since deleting it would fail the whole table.
func Plan(table, saved string) ([]byte, Removal) {
	type rule struct{ chain, spec, target string }
	var chains []string
	var rules []rule
	sc := bufio.NewScanner(strings.NewReader(saved))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	inTable := false
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "*"):
			inTable = l[1:] == table
		case !inTable:
		case strings.HasPrefix(l, ":"):
			name, _, _ := strings.Cut(l[1:], " ")
			chains = append(chains, name)
		case strings.HasPrefix(l, "-A "):
			chain, spec, _ := strings.Cut(l[3:], " ")
			rules = append(rules, rule{chain, spec, jumpTarget(spec)})
		}
	}
	owned := map[string]bool{}
	for _, c := range chains {
		if Owned(table, c) {
			owned[c] = true
		}
	}
	if len(owned) == 0 {
		return nil, Removal{}
	}
	// Keep what a foreign chain reaches: walk from foreign jumps through
	// kube-proxy's chains.
	kept := map[string]bool{}
	var todo []string
	for _, r := range rules {
		if owned[r.target] && !owned[r.chain] && !xtables.Builtin(r.chain) {
			todo = append(todo, r.target)
		}
	}
	for len(todo) > 0 {
		c := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		if kept[c] {
			continue
		}
		kept[c] = true
		for _, r := range rules {
			if r.chain == c && owned[r.target] {
				todo = append(todo, r.target)
			}
		}
	}
	var rm Removal
	var b strings.Builder
	b.WriteString("*" + table + "\n")
	for _, r := range rules {
		if xtables.Builtin(r.chain) && owned[r.target] && !kept[r.target] {
			b.WriteString("-D " + r.chain + " " + r.spec + "\n")
			rm.Jumps++
		}
	}
	for _, c := range chains {
		switch {
		case kept[c]:
			rm.Kept = append(rm.Kept, c)
		case owned[c]:
			rm.Chains = append(rm.Chains, c)
			b.WriteString(":" + c + " - [0:0]\n")
		}
	}
	for _, c := range rm.Chains {
		b.WriteString("-X " + c + "\n")
	}
	b.WriteString("COMMIT\n")
	if len(rm.Chains) == 0 && rm.Jumps == 0 {
		return nil, rm
	}
	return []byte(b.String()), rm
}

// jumpTarget returns the chain a listed rule jumps or goes to, "" for
// other targets.
func jumpTarget(spec string) string {
	f := strings.Fields(spec)
	for i := len(f) - 2; i >= 0; i-- {
		if f[i] == "-j" || f[i] == "-g" {
			return f[i+1]
		}
	}
	return ""
}
