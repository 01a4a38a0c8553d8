// A transaction: what one iptables-restore --noflush does, built from
// typed chains and rules. Each object is validated when it is added; the
// errors come back once, from Render. The rendered text maps every line
// back to the owner that added it (iptables mode: a service port's unit).

package xtables

import (
	"errors"
	"fmt"
	"slices"
)

type opKind uint8

const (
	opDeclare opKind = iota + 1 // ":CHAIN - [0:0]": create or empty
	opAdd                       // "-A CHAIN RULE"
	opDelete                    // "-X CHAIN"
	opInsert                    // "-I CHAIN 1 RULE"
)

type op[O comparable] struct {
	kind  opKind
	owner O // who wrote it; the zero O for nobody
	chain string
	rule  *Rule
}

// Transaction collects the operations of one iptables-restore, per table,
// for owners of type O (the zero O owns nothing). Build it with
// NewTransaction.
type Transaction[O comparable] struct {
	tables   []string
	ops      [][]op[O]
	declared []map[string]bool
	errs     []error
}

// NewTransaction returns an empty transaction that writes tables in the
// order given, each one even when it gets no operation.
func NewTransaction[O comparable](tables ...string) *Transaction[O] {
	return &Transaction[O]{tables: tables, ops: make([][]op[O], len(tables)), declared: make([]map[string]bool, len(tables))}
}

// OpError is an object refused when it was added; Owner is who added it.
type OpError[O comparable] struct {
	Owner O
	Err   error
}

func (e *OpError[O]) Error() string {
	var none O
	if e.Owner == none {
		return "iptables: " + e.Err.Error()
	}
	return fmt.Sprintf("iptables: unit %v: %v", e.Owner, e.Err)
}

func (e *OpError[O]) Unwrap() error { return e.Err }

// Fail records an error for owner, returned by Render.
func (tx *Transaction[O]) Fail(owner O, err error) {
	tx.errs = append(tx.errs, &OpError[O]{owner, err})
}

// table returns the index of table, or fails the transaction.
func (tx *Transaction[O]) table(owner O, c Chain) (int, bool) {
	if i := slices.Index(tx.tables, c.Table); i >= 0 {
		return i, true
	}
	tx.Fail(owner, fmt.Errorf("chain %s: table %q not in this transaction", c.Name, c.Table))
	return 0, false
}

// Grow reserves room for n more operations in table.
func (tx *Transaction[O]) Grow(table string, n int) {
	i := slices.Index(tx.tables, table)
	if i >= 0 && cap(tx.ops[i])-len(tx.ops[i]) < n {
		ops := make([]op[O], len(tx.ops[i]), len(tx.ops[i])+n)
		copy(ops, tx.ops[i])
		tx.ops[i] = ops
	}
}

// Declare creates chain c, or empties it when it exists. Declarations
// are written first in their table, in the order declared.
func (tx *Transaction[O]) Declare(owner O, c Chain) {
	if err := c.Validate(); err != nil {
		tx.Fail(owner, err)
		return
	}
	if Builtin(c.Name) {
		tx.Fail(owner, fmt.Errorf("declare built-in chain %s", c.Name))
		return
	}
	i, ok := tx.table(owner, c)
	if !ok {
		return
	}
	if tx.declared[i] == nil {
		tx.declared[i] = map[string]bool{}
	}
	tx.declared[i][c.Name] = true
	tx.ops[i] = append(tx.ops[i], op[O]{opDeclare, owner, c.Name, nil})
}

// Add appends r to chain c, which the transaction must have declared:
// appending to a chain it did not empty would duplicate rules.
func (tx *Transaction[O]) Add(owner O, c Chain, r *Rule) {
	if err := r.Validate(); err != nil {
		tx.Fail(owner, fmt.Errorf("rule in %s/%s: %w", c.Table, c.Name, err))
		return
	}
	i, ok := tx.table(owner, c)
	if !ok {
		return
	}
	if !tx.declared[i][c.Name] {
		tx.Fail(owner, fmt.Errorf("rule in %s/%s: chain not declared in this transaction", c.Table, c.Name))
		return
	}
	tx.ops[i] = append(tx.ops[i], op[O]{opAdd, owner, c.Name, r})
}

// Delete deletes chain c, which the transaction must have declared (and
// so emptied).
func (tx *Transaction[O]) Delete(c Chain) {
	var none O
	i, ok := tx.table(none, c)
	if !ok {
		return
	}
	if !tx.declared[i][c.Name] {
		tx.Fail(none, fmt.Errorf("delete %s/%s: chain not declared in this transaction", c.Table, c.Name))
		return
	}
	tx.ops[i] = append(tx.ops[i], op[O]{opDelete, none, c.Name, nil})
}

// Insert puts r first in built-in chain c.
func (tx *Transaction[O]) Insert(c Chain, r *Rule) {
	var none O
	if err := c.Validate(); err != nil {
		tx.Fail(none, err)
		return
	}
	if !Builtin(c.Name) {
		tx.Fail(none, fmt.Errorf("insert into %s/%s: not a built-in chain", c.Table, c.Name))
		return
	}
	if err := r.Validate(); err != nil {
		tx.Fail(none, fmt.Errorf("rule in %s/%s: %w", c.Table, c.Name, err))
		return
	}
	i, ok := tx.table(none, c)
	if !ok {
		return
	}
	tx.ops[i] = append(tx.ops[i], op[O]{opInsert, none, c.Name, r})
}

// Render returns the iptables-restore input and, per line, its owner
// (owners[i] for line i+1), or the errors of the objects refused when
// they were added.
func (tx *Transaction[O]) Render() (text []byte, owners []O, err error) {
	if len(tx.errs) > 0 {
		return nil, nil, errors.Join(tx.errs...)
	}
	lines, size := 2*len(tx.tables), 16
	for i := range tx.ops {
		lines += len(tx.ops[i])
		size += 140 * len(tx.ops[i])
	}
	w := argWriter{mode: asText, b: make([]byte, 0, size)}
	owners = make([]O, 0, lines)
	var none O
	for i, table := range tx.tables {
		w.b = append(append(append(w.b, '*'), table...), '\n')
		owners = append(owners, none)
		// Declarations first, then the rest as added: a declaration only
		// creates or empties its chain, and every other operation on a
		// chain came after its declaration.
		for _, declare := range []bool{true, false} {
			for j := range tx.ops[i] {
				if o := &tx.ops[i][j]; (o.kind == opDeclare) == declare {
					o.appendText(&w)
					owners = append(owners, o.owner)
				}
			}
		}
		w.b = append(w.b, "COMMIT\n"...)
		owners = append(owners, none)
	}
	return w.b, owners, nil
}

// String is the transaction as iptables-restore reads it (what the
// golden files hold), or its errors.
func (tx *Transaction[O]) String() string {
	text, _, err := tx.Render()
	if err != nil {
		return "invalid transaction: " + err.Error()
	}
	return string(text)
}

// appendText appends the operation's line to w.b.
func (o *op[O]) appendText(w *argWriter) {
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

// FailedOwner returns the owner of the object that made err: one refused
// when it was added (OpError), or the one owning the line iptables-restore
// reported as failed (RestoreError; owners as Render returned them). The
// zero O when nobody is to blame.
func FailedOwner[O comparable](err error, owners []O) O {
	var oe *OpError[O]
	if errors.As(err, &oe) {
		return oe.Owner
	}
	var re *RestoreError
	if errors.As(err, &re) && re.Line >= 1 && re.Line <= len(owners) {
		return owners[re.Line-1]
	}
	var none O
	return none
}
