// A transaction: what one iptables-restore --noflush does, built from
// typed chains and rules. Each object is validated when it is added; the
// errors come back once, from render. The rendered text maps every line
// back to the unit that added it.

package iptables

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

type opKind uint8

const (
	opDeclare opKind = iota + 1 // ":CHAIN - [0:0]": create or empty
	opAdd                       // "-A CHAIN RULE"
	opDelete                    // "-X CHAIN"
	opInsert                    // "-I CHAIN 1 RULE"
)

type op struct {
	kind  opKind
	owner *unitID // the unit that wrote it, nil for none
	chain string
	rule  *rule
}

// tables lists the tables a transaction writes, in the order written.
var tables = [...]string{tableFilter, tableNAT}

func tableIndex(table string) int {
	if table == tableNAT {
		return 1
	}
	return 0
}

// transaction collects the operations of one iptables-restore, per table.
type transaction struct {
	ops      [len(tables)][]op
	declared [len(tables)]map[string]bool
	errs     []error
}

// opError is an object refused when it was added; owner is the unit that
// added it.
type opError struct {
	owner *unitID
	err   error
}

func (e *opError) Error() string {
	if e.owner == nil {
		return "iptables: " + e.err.Error()
	}
	return fmt.Sprintf("iptables: unit %s: %v", e.owner, e.err)
}

func (e *opError) Unwrap() error { return e.err }

func (tx *transaction) fail(owner *unitID, err error) {
	tx.errs = append(tx.errs, &opError{owner, err})
}

// grow reserves room for n more operations in table.
func (tx *transaction) grow(table string, n int) {
	i := tableIndex(table)
	if cap(tx.ops[i])-len(tx.ops[i]) < n {
		ops := make([]op, len(tx.ops[i]), len(tx.ops[i])+n)
		copy(ops, tx.ops[i])
		tx.ops[i] = ops
	}
}

// declare creates chain c, or empties it when it exists.
func (tx *transaction) declare(owner *unitID, c tableChain) {
	if err := c.validate(); err != nil {
		tx.fail(owner, err)
		return
	}
	if builtin(c.name) {
		tx.fail(owner, fmt.Errorf("declare built-in chain %s", c.name))
		return
	}
	i := tableIndex(c.table)
	if tx.declared[i] == nil {
		tx.declared[i] = map[string]bool{}
	}
	tx.declared[i][c.name] = true
	tx.ops[i] = append(tx.ops[i], op{opDeclare, owner, c.name, nil})
}

// add appends r to chain c, which the transaction must have declared:
// appending to a chain it did not empty would duplicate rules.
func (tx *transaction) add(owner *unitID, c tableChain, r *rule) {
	if err := r.validate(); err != nil {
		tx.fail(owner, fmt.Errorf("rule in %s/%s: %w", c.table, c.name, err))
		return
	}
	i := tableIndex(c.table)
	if !tx.declared[i][c.name] {
		tx.fail(owner, fmt.Errorf("rule in %s/%s: chain not declared in this transaction", c.table, c.name))
		return
	}
	tx.ops[i] = append(tx.ops[i], op{opAdd, owner, c.name, r})
}

// delete deletes chain c, which the transaction must have declared (and
// so emptied).
func (tx *transaction) delete(c tableChain) {
	i := tableIndex(c.table)
	if !tx.declared[i][c.name] {
		tx.fail(nil, fmt.Errorf("delete %s/%s: chain not declared in this transaction", c.table, c.name))
		return
	}
	tx.ops[i] = append(tx.ops[i], op{opDelete, nil, c.name, nil})
}

// insert puts r first in built-in chain c.
func (tx *transaction) insert(c tableChain, r *rule) {
	if err := c.validate(); err != nil {
		tx.fail(nil, err)
		return
	}
	if !builtin(c.name) {
		tx.fail(nil, fmt.Errorf("insert into %s/%s: not a built-in chain", c.table, c.name))
		return
	}
	if err := r.validate(); err != nil {
		tx.fail(nil, fmt.Errorf("rule in %s/%s: %w", c.table, c.name, err))
		return
	}
	tx.ops[tableIndex(c.table)] = append(tx.ops[tableIndex(c.table)], op{opInsert, nil, c.name, r})
}

// render returns the iptables-restore input and, per line, the unit that
// owns it (owner[i] for line i+1), or the errors of the objects refused
// when they were added.
func (tx *transaction) render() (text []byte, owner []*unitID, err error) {
	if len(tx.errs) > 0 {
		return nil, nil, errors.Join(tx.errs...)
	}
	lines, size := 2*len(tables), 16
	for i := range tx.ops {
		lines += len(tx.ops[i])
		size += 140 * len(tx.ops[i])
	}
	w := argWriter{mode: asText, b: make([]byte, 0, size)}
	owner = make([]*unitID, 0, lines)
	for i, table := range tables {
		w.b = append(append(append(w.b, '*'), table...), '\n')
		owner = append(owner, nil)
		// Declarations first, in name order, then the rest as added (see
		// declarations).
		for _, o := range declarations(tx.ops[i]) {
			o.appendText(&w)
			owner = append(owner, o.owner)
		}
		for j := range tx.ops[i] {
			if o := &tx.ops[i][j]; o.kind != opDeclare {
				o.appendText(&w)
				owner = append(owner, o.owner)
			}
		}
		w.b = append(w.b, "COMMIT\n"...)
		owner = append(owner, nil)
	}
	return w.b, owner, nil
}

// declarations returns a table's chain declarations sorted by name, to be
// written before its other operations. The meaning is the same (a
// declaration only creates or empties its chain, and every other operation
// on a chain came after its declaration), but iptables-nft 1.8 keeps its
// chain cache sorted by name and inserts each declared chain by walking
// it: declarations in name order are appended, in any other order they
// cost a walk each. At 5,000 services a cold restore took 3.4 s of which
// 2.2 s user time; sorted, 2.1 s and 1.1 s.
func declarations(ops []op) []*op {
	var out []*op
	for j := range ops {
		if ops[j].kind == opDeclare {
			out = append(out, &ops[j])
		}
	}
	slices.SortStableFunc(out, func(a, b *op) int { return strings.Compare(a.chain, b.chain) })
	return out
}

// String is the transaction as iptables-restore reads it (what the
// golden files hold), or its errors.
func (tx *transaction) String() string {
	text, _, err := tx.render()
	if err != nil {
		return "invalid transaction: " + err.Error()
	}
	return string(text)
}

// appendText appends the operation's line to w.b.
func (o *op) appendText(w *argWriter) {
	switch o.kind {
	case opDeclare:
		w.b = append(append(append(w.b, ':'), o.chain...), " - [0:0]"...)
	case opDelete:
		w.b = append(append(w.b, "-X "...), o.chain...)
	case opAdd:
		w.b = append(append(append(w.b, "-A "...), o.chain...), ' ')
		w.n = 0
		o.rule.write(w)
	case opInsert:
		w.b = append(append(append(w.b, "-I "...), o.chain...), " 1 "...)
		w.n = 0
		o.rule.write(w)
	}
	w.b = append(w.b, '\n')
}

// failedOwner returns the unit whose object made err: one refused when it
// was added, or the one owning the line iptables-restore reported as
// failed (xtables.RestoreError; owner as render returned it). Nil when no
// unit is to blame.
func failedOwner(err error, owner []*unitID) *unitID {
	var oe *opError
	if errors.As(err, &oe) {
		return oe.owner
	}
	var re *xtables.RestoreError
	if errors.As(err, &re) && re.Line >= 1 && re.Line <= len(owner) {
		return owner[re.Line-1]
	}
	return nil
}
