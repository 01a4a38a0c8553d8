package iptables

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"time"

	goipt "github.com/coreos/go-iptables/iptables"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// CleanupAll removes every chain and jump edgeproxy created, under both
// iptables backends and both IP families, wherever the binaries exist. It
// needs no Proxier, so it also works when New refuses to start (for
// example with ErrBothBackends); `edgeproxy cleanup` should call it.
func CleanupAll(ctx context.Context, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	var errs []error
	for _, v := range []Variant{Legacy, NFT} {
		for _, fam := range []datapath.Family{datapath.IPv4, datapath.IPv6} {
			if v == Legacy && !xtables.LegacyTable(fam, xtables.NAT) && !xtables.LegacyTable(fam, xtables.Filter) {
				continue // nothing of ours, and listing would create the tables
			}
			if v == NFT && !nftTable(fam, xtables.NAT) && !nftTable(fam, xtables.Filter) {
				continue // nothing of ours: no iptables-nft table
			}
			f, err := openFamily(v, fam, 5*time.Second, log)
			if err != nil {
				var ee *exec.Error
				if errors.As(err, &ee) {
					continue // this variant is not installed
				}
				errs = append(errs, err)
				continue
			}
			if err := f.cleanup(ctx); err != nil {
				errs = append(errs, fmt.Errorf("%s IPv%d: %w", v, fam, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Cleanup implements datapath.Backend: it removes the jumps and every chain
// whose name starts with Prefix, in both tables, both families and both
// backends (see CleanupAll), and nothing else. The next Apply starts from
// scratch.
func (p *Proxier) Cleanup(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, f := range p.fams {
		if err := f.cleanup(ctx); err != nil {
			errs = append(errs, err)
		}
		f.applied, f.units, f.lastFixed, f.lastFixedSum = false, nil, nil, digest{}
	}
	// Chains a previous run left under the other backend or family.
	if err := CleanupAll(ctx, p.log); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (f *family) cleanup(ctx context.Context) error {
	var errs []error
	for _, j := range append(jumps(f.cfg.Family), obsoleteJumps()...) {
		if err := f.ipt.DeleteIfExists(j.Table, j.Chain, j.Rule.Args()...); err != nil {
			var e *goipt.Error
			if !errors.As(err, &e) || !e.IsNotExist() {
				errs = append(errs, fmt.Errorf("iptables: delete jump %s/%s: %w", j.Table, j.Chain, err))
			}
		}
	}
	chains, err := f.ourChains()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	if len(chains) == 0 {
		return errors.Join(errs...)
	}
	tx := newTransaction()
	for _, c := range chains {
		tx.Declare(nil, c)
	}
	for _, c := range chains {
		tx.Delete(c)
	}
	text, _, err := tx.Render()
	if err == nil {
		var none restorer
		_, err = f.restore(ctx, &none, text)
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("iptables: cleanup: %w", err))
	}
	return errors.Join(errs...)
}
