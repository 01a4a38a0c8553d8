// Our chains and the jumps to them as the kernel holds them: listed on a
// family's first apply and after a failure (existingChains, listOurs),
// and the jumps from the built-in chains put in place one by one
// (ensureJumps).

package iptables

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// existingChains returns, for a rewrite, the chains of ours that exist
// (a rewrite removes those the plan does not want). What the kernel
// holds is listed on the first apply (adopting a previous run's chains)
// and after a failure, and then the missing jumps from built-in chains
// are known too: they are written in the same restore as the chains they
// lead to, so that rules are live the moment they are in the kernel.
// Otherwise what we wrote last is known, and listing a large table is
// costly.
func (f *family) existingChains(mode syncMode) (existing []xtables.Chain, missing []xtables.Jump, listed bool, err error) {
	switch {
	case mode == modeRewrite && (!f.applied || f.needFull):
		existing, missing, err = f.listOurs()
		return existing, missing, true, err
	case mode == modeRewrite:
		for _, u := range f.units {
			existing = append(existing, u.names...)
		}
	}
	return existing, nil, false, nil
}

// ourChains lists the chains with our prefix in the tables we use.
func (f *family) ourChains() ([]xtables.Chain, error) {
	chains, _, err := f.listOurs()
	return chains, err
}

// listOurs lists, with one `iptables -S` per table, the chains with our
// prefix and the jumps from built-in chains (jumps()) that are missing.
func (f *family) listOurs() (chains []xtables.Chain, missing []xtables.Jump, err error) {
	rules := map[string]string{}
	for _, t := range []string{xtables.NAT, xtables.Filter} {
		out, err := f.io.Run(context.Background(), "-t", t, "-S")
		if err != nil {
			return nil, nil, fmt.Errorf("iptables: list the chains of %s: %w", t, err)
		}
		rules[t] = out
		for _, l := range strings.Split(out, "\n") {
			if name, ok := strings.CutPrefix(l, "-N "); ok && ours(name) {
				chains = append(chains, xtables.Chain{Table: t, Name: name})
			}
		}
	}
	for _, j := range jumps(f.cfg.Family) {
		if !hasRule(rules[j.Table], j) {
			missing = append(missing, j)
		}
	}
	for _, j := range obsoleteJumps() {
		if hasRule(rules[j.Table], j) {
			if err := f.ipt.DeleteIfExists(j.Table, j.Chain, j.Rule.Args()...); err != nil {
				return nil, nil, fmt.Errorf("iptables: delete obsolete jump %s/%s -> %s: %w", j.Table, j.Chain, j.To(), err)
			}
		}
	}
	return chains, missing, nil
}

// hasRule reports whether a listing (iptables -S or iptables-save) holds
// rule j: a rule in its chain that jumps to its target with its comment.
func hasRule(listing string, j xtables.Jump) bool {
	for _, l := range strings.Split(listing, "\n") {
		if isJump(l, j) {
			return true
		}
	}
	return false
}

// isJump reports whether line l of a listing is rule j.
func isJump(l string, j xtables.Jump) bool {
	return strings.HasPrefix(l, "-A "+j.Chain+" ") && strings.HasSuffix(strings.TrimSpace(l), "-j "+j.To()) && strings.Contains(l, j.Rule.Comment)
}

// orderJumps puts our jumps in each built-in chain in the order jumps()
// lists them, where they stand in another: an older version may have
// written them so (before the localnet drop came first in IPv4, a
// neighbour's packet to 127.0.0.1 met a no-endpoints NodePort's reject
// first), and ensureJumps inserts a missing one at the top. A misplaced
// jump is inserted again right after the one it must follow, then its
// first, misplaced copy deleted by its text: every jump is in its chain
// throughout, and no rule is deleted by its number, which a rule another
// program inserts meanwhile would move. (So jumps only move down: putting
// IPv4's localnet drop back first moves the four jumps it must precede.)
// It lists the table of each chain that holds several of our jumps once
// (as listOurs does), and again after each move.
func (f *family) orderJumps() error {
	var errs []error
	byChain := map[xtables.Chain][]xtables.Jump{}
	var chains []xtables.Chain
	for _, j := range jumps(f.cfg.Family) {
		c := xtables.Chain{Table: j.Table, Name: j.Chain}
		if byChain[c] == nil {
			chains = append(chains, c)
		}
		byChain[c] = append(byChain[c], j)
	}
	for _, c := range chains {
		js := byChain[c]
		if len(js) < 2 {
			continue
		}
		moves := 0
		for range len(js) { // each move puts one more jump in place
			out, err := f.io.Run(context.Background(), "-t", c.Table, "-S")
			if err != nil {
				errs = append(errs, fmt.Errorf("iptables: list the chains of %s: %w", c.Table, err))
				break
			}
			j, at, ok := misplaced(strings.Split(out, "\n"), c.Name, js)
			if !ok {
				break
			}
			args := j.Rule.Args()
			if err := f.ipt.Insert(c.Table, c.Name, at, args...); err != nil {
				errs = append(errs, fmt.Errorf("iptables: move jump %s/%s -> %s: %w", j.Table, j.Chain, j.To(), err))
				break
			}
			if err := f.ipt.Delete(c.Table, c.Name, args...); err != nil {
				errs = append(errs, fmt.Errorf("iptables: delete misplaced jump %s/%s -> %s: %w", j.Table, j.Chain, j.To(), err))
				break
			}
			moves++
		}
		if moves > 0 {
			f.log.Info("put our jumps from a built-in chain in order", "table", c.Table, "chain", c.Name, "moved", moves)
		}
	}
	return errors.Join(errs...)
}

// misplaced finds, in a table's listing (`iptables -S`), the first of js
// (chain's jumps, in their order) that stands before one listed before
// it, and the rule number in chain that puts it right after that one. A
// jump missing from the chain constrains nothing; of a jump listed twice
// the first place counts (the one a delete by its text removes).
func misplaced(listing []string, chain string, js []xtables.Jump) (j xtables.Jump, at int, ok bool) {
	first := make([]int, len(js))
	n := 0
	for _, l := range listing {
		if !strings.HasPrefix(l, "-A "+chain+" ") {
			continue
		}
		n++
		for i, j := range js {
			if first[i] == 0 && isJump(l, j) {
				first[i] = n
			}
		}
	}
	prev := 0
	for i, p := range first {
		switch {
		case p == 0:
		case p < prev:
			return js[i], prev + 1, true
		default:
			prev = p
		}
	}
	return xtables.Jump{}, 0, false
}

// ensureJumps puts each jump from a built-in chain in place, first in its
// chain, unless it is already there.
func (f *family) ensureJumps() error {
	var errs []error
	// Walk backwards inserting at the top, so that jumps missing together
	// end up in the order jumps() lists them.
	js := jumps(f.cfg.Family)
	slices.Reverse(js)
	for _, j := range js {
		args := j.Rule.Args()
		ok, err := f.ipt.Exists(j.Table, j.Chain, args...)
		if err != nil {
			errs = append(errs, fmt.Errorf("iptables: check jump %s/%s -> %s: %w", j.Table, j.Chain, j.To(), err))
			continue
		}
		if ok {
			continue
		}
		if err := f.ipt.Insert(j.Table, j.Chain, 1, args...); err != nil {
			errs = append(errs, fmt.Errorf("iptables: insert jump %s/%s -> %s: %w", j.Table, j.Chain, j.To(), err))
		}
	}
	return errors.Join(errs...)
}
