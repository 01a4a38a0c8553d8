package nftables

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
)

// affMatch names a frontend as an affinity entry's key does.
type affMatch struct {
	addr  netip.Addr // invalid: a node port, on any of the node's addresses
	proto uint8
	port  uint16
}

// sweepAffinity removes the affinity entries that no frontend with
// session affinity would hold now: its frontend is gone or has no
// affinity any more, or the endpoint is no longer one of its own. It
// reads the affinity map (the clients' entries, never our rules) and
// destroys the stale entries in one transaction (an entry that expires
// meanwhile is no error).
func (p *Proxier) sweepAffinity(t *table) error {
	if !t.affinity {
		return nil
	}
	valid := map[affMatch]map[netip.AddrPort]bool{}
	for _, u := range t.units {
		for _, a := range u.aff {
			m := affMatch{a.addr, a.proto, a.port}
			if valid[m] == nil {
				valid[m] = map[netip.AddrPort]bool{}
			}
			for _, e := range a.eps {
				valid[m][e] = true
			}
		}
	}
	set := newObjects(t.f).sets[mapAffinity]
	elems, err := p.conn.GetSetElements(set)
	if err != nil {
		return fmt.Errorf("nftables: read the affinity map: %w", err)
	}
	n := int(t.f.addrLen)
	var stale []nftables.SetElement
	for _, e := range elems {
		if len(e.Key) < 2*n+8 || len(e.Val) < n+2 {
			continue
		}
		daddr, _ := netip.AddrFromSlice(e.Key[n : 2*n])
		proto, port := e.Key[2*n], binary.BigEndian.Uint16(e.Key[2*n+4:])
		ep, _ := netip.AddrFromSlice(e.Val[:n])
		to := netip.AddrPortFrom(ep, binary.BigEndian.Uint16(e.Val[n:]))
		eps, ok := valid[affMatch{daddr, proto, port}]
		if !ok {
			eps = valid[affMatch{netip.Addr{}, proto, port}]
		}
		if !eps[to] {
			stale = append(stale, nftables.SetElement{Key: e.Key})
		}
	}
	if len(stale) == 0 {
		return nil
	}
	if err := p.conn.SetDestroyElements(set, stale); err != nil {
		return fmt.Errorf("nftables: affinity entries: %w", err)
	}
	if err := p.conn.Flush(); err != nil {
		return fmt.Errorf("nftables: remove %d stale affinity entries: %w", len(stale), err)
	}
	p.log.Debug("removed stale session affinity entries", "family", t.f.name, "count", len(stale))
	return nil
}
