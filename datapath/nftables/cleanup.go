package nftables

import (
	"context"
	"fmt"

	"github.com/google/nftables"
)

// Cleanup removes edgeproxy's tables in both families ("add table; delete
// table" in one transaction: there is nothing to fail on when a table is
// missing) and forgets what was written: the next Apply rebuilds.
func (p *Proxier) Cleanup(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range []*fam{famIPv4, famIPv6} {
		t := &nftables.Table{Family: f.tf, Name: TableName}
		p.conn.AddTable(t)
		p.conn.DelTable(t)
	}
	if err := p.conn.Flush(); err != nil {
		return fmt.Errorf("nftables: cleanup: %w", err)
	}
	for i, t := range p.tables {
		p.tables[i] = newTable(t.f)
	}
	return nil
}

// HoldsRules reports whether the kernel already holds edgeproxy's table in
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
		tables, err := p.conn.ListTablesOfFamily(t.f.tf)
		if err != nil {
			return false, fmt.Errorf("nftables: list %s tables: %w", t.f.name, err)
		}
		for _, tb := range tables {
			if tb.Name == TableName {
				return true, nil
			}
		}
	}
	return false, nil
}
