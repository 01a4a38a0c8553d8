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
	target := j.To()
	for _, l := range strings.Split(listing, "\n") {
		if strings.HasPrefix(l, "-A "+j.Chain+" ") && strings.HasSuffix(strings.TrimSpace(l), "-j "+target) && strings.Contains(l, j.Rule.Comment) {
			return true
		}
	}
	return false
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
