package nftables

import (
	"context"
	"fmt"
	"slices"

	"github.com/google/nftables"
)

// Cleanup removes edgeproxy's tables in both families, the main one and
// every service table, of any number (Ours: a table list, then "add
// table; delete table" for each in one transaction: there is nothing to
// fail on when a table is missing), and forgets what was written: the
// next Apply rebuilds.
func (p *Proxier) Cleanup(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range []*fam{famIPv4, famIPv6} {
		names := []string{TableName}
		for i := range p.opts.shardCount() {
			names = append(names, tabName(uint8(i+1)))
		}
		ours, err := p.ourTables(f)
		if err != nil {
			return fmt.Errorf("nftables: cleanup: %w", err)
		}
		for _, n := range ours {
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
		for _, n := range names {
			t := &nftables.Table{Family: f.tf, Name: n}
			p.conn.AddTable(t)
			p.conn.DelTable(t)
		}
	}
	if err := p.conn.Flush(); err != nil {
		return fmt.Errorf("nftables: cleanup: %w", err)
	}
	for i, t := range p.tables {
		p.tables[i] = newTable(t.f)
	}
	return nil
}

// HoldsRules reports whether the kernel already holds a table of ours in
// any family this Proxier programs, e.g. left by an earlier run of the
// agent (a dump of table names only). A node that has just rebooted holds
// none: the agent then programs its last known state at once.
func (p *Proxier) HoldsRules(ctx context.Context) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, t := range p.tables {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		ours, err := p.ourTables(t.f)
		if err != nil {
			return false, err
		}
		if len(ours) > 0 {
			return true, nil
		}
	}
	return false, nil
}

// ourTables names the tables of ours (Ours) that the kernel holds in
// family f: a dump of table names only.
func (p *Proxier) ourTables(f *fam) ([]string, error) {
	tables, err := p.conn.ListTablesOfFamily(f.tf)
	if err != nil {
		return nil, fmt.Errorf("nftables: list %s tables: %w", f.name, err)
	}
	var ours []string
	for _, tb := range tables {
		if Ours(tb.Name) {
			ours = append(ours, tb.Name)
		}
	}
	return ours, nil
}
