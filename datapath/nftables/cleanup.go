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
