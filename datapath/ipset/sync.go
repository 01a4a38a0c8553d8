package ipset

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/edgeproxy/edgeproxy/datapath"
)

// Stats counts the kernel operations one Sync made.
type Stats struct {
	Created, Replaced, Added, Deleted int
}

// Sync makes set s exist with exactly the entries given. Missing entries
// are added and extra ones deleted; the set is never flushed. A set of the
// same name with another type or family is replaced: by creating the new
// set under a temporary name, filling it, swapping the two and destroying
// the old one when the kernel allows the swap (same type features), or by
// destroying and recreating it otherwise, which fails with ErrInUse while
// an iptables rule still refers to it.
func Sync(k Kernel, s Set, entries []Entry) (Stats, error) {
	var st Stats
	if err := s.validate(); err != nil {
		return st, err
	}
	want := make(map[Entry]bool, len(entries))
	for _, e := range entries {
		n, err := normalize(s.Type, e)
		if err != nil {
			return st, fmt.Errorf("ipset: set %s: %w", s.Name, err)
		}
		if !fitsFamily(n, s.Family) {
			return st, fmt.Errorf("ipset: set %s: entry %s is not IPv%d", s.Name, n, s.Family)
		}
		want[n] = true
	}
	cur, have, ok, err := k.Get(s.Name)
	if err != nil {
		return st, err
	}
	if ok && !sameKind(cur, s) {
		err := replace(k, s, want)
		if err == nil {
			st.Replaced++
			st.Added += len(want)
		}
		return st, err
	}
	if !ok {
		if err := k.Create(s); err != nil {
			return st, err
		}
		st.Created++
	}
	got := make(map[Entry]bool, len(have))
	for _, e := range have {
		got[e] = true
	}
	var errs []error
	for _, e := range sorted(want) {
		if got[e] {
			continue
		}
		if err := k.Add(s, e); err != nil {
			errs = append(errs, err)
			continue
		}
		st.Added++
	}
	for _, e := range sorted(got) {
		if want[e] {
			continue
		}
		if err := k.Del(s, e); err != nil {
			errs = append(errs, err)
			continue
		}
		st.Deleted++
	}
	return st, errors.Join(errs...)
}

// Holds reports whether the kernel's set s exists with s's type and
// family and holds exactly entries, compared as Sync compares them: a set
// flushed, edited or replaced by hand does not.
func Holds(k Kernel, s Set, entries []Entry) (bool, error) {
	want := make(map[Entry]bool, len(entries))
	for _, e := range entries {
		n, err := normalize(s.Type, e)
		if err != nil {
			return false, fmt.Errorf("ipset: set %s: %w", s.Name, err)
		}
		want[n] = true
	}
	cur, have, ok, err := k.Get(s.Name)
	if err != nil || !ok || !sameKind(cur, s) || len(have) != len(want) {
		return false, err
	}
	for _, e := range have {
		if !want[e] {
			return false, nil
		}
	}
	return true, nil
}

// fitsFamily reports whether every address of e is of family f.
func fitsFamily(e Entry, f datapath.Family) bool {
	for _, a := range []netip.Addr{e.Addr, e.Addr2, e.Net.Addr()} {
		if a.IsValid() && datapath.FamilyOf(a) != f {
			return false
		}
	}
	return true
}

func sameKind(a, b Set) bool {
	return a.Type == b.Type && (a.Type == BitmapPort || a.Family == b.Family)
}

// tempName derives the name the replacement is built under; it keeps
// within MaxNameLen.
func tempName(name string) string {
	const suffix = "-new"
	if len(name)+len(suffix) > MaxNameLen {
		name = name[:MaxNameLen-len(suffix)]
	}
	return name + suffix
}

func replace(k Kernel, s Set, want map[Entry]bool) error {
	tmp := s
	tmp.Name = tempName(s.Name)
	if _, _, ok, err := k.Get(tmp.Name); err != nil {
		return err
	} else if ok {
		if err := k.Destroy(tmp.Name); err != nil {
			return fmt.Errorf("ipset: replace %s: leftover %s: %w", s.Name, tmp.Name, err)
		}
	}
	if err := k.Create(tmp); err != nil {
		return fmt.Errorf("ipset: replace %s: %w", s.Name, err)
	}
	for _, e := range sorted(want) {
		if err := k.Add(tmp, e); err != nil {
			_ = k.Destroy(tmp.Name)
			return fmt.Errorf("ipset: replace %s: %w", s.Name, err)
		}
	}
	if err := k.Swap(s.Name, tmp.Name); err == nil {
		// tmp now holds the old set.
		if err := k.Destroy(tmp.Name); err != nil {
			return fmt.Errorf("ipset: replace %s: destroy the old set: %w", s.Name, err)
		}
		return nil
	}
	// The kernel swaps only sets with the same type features; otherwise
	// the old set has to go first.
	if err := k.Destroy(s.Name); err != nil {
		_ = k.Destroy(tmp.Name)
		return fmt.Errorf("ipset: replace %s with %s: %w", s.Name, s.Type, err)
	}
	if err := k.Create(s); err != nil {
		_ = k.Destroy(tmp.Name)
		return fmt.Errorf("ipset: replace %s: %w", s.Name, err)
	}
	var errs []error
	for _, e := range sorted(want) {
		if err := k.Add(s, e); err != nil {
			errs = append(errs, err)
		}
	}
	if err := k.Destroy(tmp.Name); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func sorted(m map[Entry]bool) []Entry {
	es := make([]Entry, 0, len(m))
	for e := range m {
		es = append(es, e)
	}
	slices.SortFunc(es, Entry.Compare)
	return es
}

// Compare orders entries by address, port, protocol, second address and
// network; cheap enough to sort tens of thousands of entries per sync.
func (e Entry) Compare(o Entry) int {
	if c := e.Addr.Compare(o.Addr); c != 0 {
		return c
	}
	if e.Port != o.Port {
		return int(e.Port) - int(o.Port)
	}
	if c := strings.Compare(string(e.Protocol), string(o.Protocol)); c != 0 {
		return c
	}
	if c := e.Addr2.Compare(o.Addr2); c != 0 {
		return c
	}
	if c := e.Net.Addr().Compare(o.Net.Addr()); c != 0 {
		return c
	}
	return e.Net.Bits() - o.Net.Bits()
}

// Destroy removes the named set if it exists.
func Destroy(k Kernel, name string) error {
	_, _, ok, err := k.Get(name)
	if err != nil || !ok {
		return err
	}
	return k.Destroy(name)
}
