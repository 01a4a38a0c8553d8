package xtables

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
)

// Fake is an in-memory iptables for tests, in the manner of knftables'
// Fake: tables of chains of typed rules. It applies iptables-restore
// --noflush input all or nothing (the real tool commits per table),
// parsing every rule with ParseRule, so input the typed model cannot
// express is refused with its line named (a RestoreError), as
// iptables-restore refuses what it cannot parse. It answers the
// iptables commands both modes use (-S, -C, -I, -D, -L, -F, -X) and
// iptables-save (SaveTable), and Dump shows its state; Trace walks a
// packet through it.
//
// A Fake is safe for use by several goroutines.
type Fake struct {
	mu     sync.Mutex
	chains map[Chain][]Rule
	// Restores counts the restores committed, Aborted those started
	// and aborted.
	Restores, Aborted int
}

// builtins are the built-in chains of each table a Fake starts with.
var builtins = map[string][]string{
	Filter: {"INPUT", "FORWARD", "OUTPUT"},
	NAT:    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	Mangle: {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"},
}

// fakeTables is the order in which Dump lists the tables.
var fakeTables = []string{Filter, NAT, Mangle}

// NewFake returns a Fake holding the built-in chains of the filter, nat
// and mangle tables, empty.
func NewFake() *Fake {
	f := &Fake{chains: map[Chain][]Rule{}}
	for t, names := range builtins {
		for _, n := range names {
			f.chains[Chain{t, n}] = nil
		}
	}
	return f
}

// RestoreNoFlush applies an iptables-restore --noflush input.
func (f *Fake) RestoreNoFlush(_ context.Context, text []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	next := maps.Clone(f.chains)
	for c, rules := range next {
		next[c] = slices.Clone(rules)
	}
	table := ""
	for i, l := range strings.Split(strings.TrimSuffix(string(text), "\n"), "\n") {
		if err := restoreLine(next, &table, l); err != nil {
			return &RestoreError{Line: i + 1, Err: fmt.Errorf("fake iptables-restore: line %d failed: %w", i+1, err)}
		}
	}
	f.chains = next
	f.Restores++
	return nil
}

func restoreLine(chains map[Chain][]Rule, table *string, l string) error {
	switch {
	case strings.HasPrefix(l, "*"):
		*table = l[1:]
		return nil
	case l == "COMMIT":
		*table = ""
		return nil
	case *table == "":
		return fmt.Errorf("%q outside a table", l)
	case strings.HasPrefix(l, ":"):
		n, _, _ := strings.Cut(l[1:], " ")
		c := Chain{*table, n}
		if err := c.Validate(); err != nil {
			return err
		}
		if !Builtin(n) {
			chains[c] = []Rule{}
		}
		return nil
	}
	op, rest, _ := strings.Cut(l, " ")
	name, rest, _ := strings.Cut(rest, " ")
	c := Chain{*table, name}
	switch op {
	case "-A", "-I":
		if op == "-I" {
			var ok bool
			if rest, ok = strings.CutPrefix(rest, "1 "); !ok {
				return fmt.Errorf("%q: only -I CHAIN 1 is supported", l)
			}
		}
		r, err := ParseRule(rest)
		if err != nil {
			return err
		}
		return insert(chains, c, r, op == "-I")
	case "-D":
		r, err := ParseRule(rest)
		if err != nil {
			return err
		}
		rules := chains[c]
		i := slices.IndexFunc(rules, func(o Rule) bool { return o.Text() == r.Text() })
		if i < 0 {
			return fmt.Errorf("%q: Bad rule (does a matching rule exist in that chain?)", l)
		}
		chains[c] = slices.Delete(rules, i, i+1)
		return nil
	case "-X":
		if err := deletable(chains, c); err != nil {
			return err
		}
		delete(chains, c)
		return nil
	}
	return fmt.Errorf("cannot parse %q", l)
}

// insert puts r first in c, or last.
func insert(chains map[Chain][]Rule, c Chain, r Rule, first bool) error {
	if _, ok := chains[c]; !ok {
		return fmt.Errorf("chain %s does not exist", c.Name)
	}
	if t := &r.Target; t.kind == tJump {
		if _, ok := chains[Chain{c.Table, t.chain}]; !ok {
			return fmt.Errorf("target %s does not exist", t.chain)
		}
	}
	if first {
		chains[c] = slices.Insert(chains[c], 0, r)
	} else {
		chains[c] = append(chains[c], r)
	}
	return nil
}

// deletable says why c cannot be deleted: it holds rules, or is jumped to.
func deletable(chains map[Chain][]Rule, c Chain) error {
	if Builtin(c.Name) {
		return fmt.Errorf("chain %s is built in", c.Name)
	}
	if _, ok := chains[c]; !ok {
		return fmt.Errorf("chain %s does not exist", c.Name)
	}
	if len(chains[c]) > 0 {
		return fmt.Errorf("chain %s is not empty", c.Name)
	}
	for from, rules := range chains {
		for i := range rules {
			if from.Table == c.Table && rules[i].Target.Jumps(c.Name) {
				return fmt.Errorf("chain %s is referenced by %s", c.Name, from.Name)
			}
		}
	}
	return nil
}

// StartRestore starts a restore whose input is applied at Commit.
func (f *Fake) StartRestore(context.Context) (*FakeRestore, error) {
	return &FakeRestore{f: f}, nil
}

// FakeRestore collects a restore's input; Abort drops it.
type FakeRestore struct {
	f     *Fake
	input []byte
}

func (r *FakeRestore) Write(p []byte) (int, error) {
	r.input = append(r.input, p...)
	return len(p), nil
}

// Commit applies the input written, all or nothing.
func (r *FakeRestore) Commit() (RestoreStats, error) {
	return RestoreStats{}, r.f.RestoreNoFlush(context.Background(), r.input)
}

// Abort drops the input.
func (r *FakeRestore) Abort() {
	r.f.mu.Lock()
	r.f.Aborted++
	r.f.mu.Unlock()
}

// Run answers the iptables commands "-t TABLE" followed by -S (every
// chain, "-N" for each user chain, then every rule), -C/-D CHAIN RULE
// (check, delete the first equal rule), -I CHAIN 1 RULE, -n -L CHAIN
// (whether it exists), -F CHAIN and -X CHAIN. Errors read as iptables'.
func (f *Fake) Run(_ context.Context, args ...string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(args) < 3 || args[0] != "-t" {
		return "", fmt.Errorf("fake iptables: %q not supported", args)
	}
	table, cmd, rest := args[1], args[2], args[3:]
	if cmd == "-S" && len(rest) == 0 {
		return f.list(table), nil
	}
	if cmd == "-n" && len(rest) == 2 && rest[0] == "-L" {
		cmd, rest = "-L", rest[1:]
	}
	if len(rest) == 0 {
		return "", fmt.Errorf("fake iptables: %q not supported", args)
	}
	c := Chain{table, rest[0]}
	rules, exists := f.chains[c]
	if !exists {
		return "", fmt.Errorf("iptables: No chain/target/match by that name (chain %s)", c.Name)
	}
	switch cmd {
	case "-L":
		return "", nil
	case "-F":
		f.chains[c] = []Rule{}
		return "", nil
	case "-X":
		if err := deletable(f.chains, c); err != nil {
			return "", fmt.Errorf("iptables: %w", err)
		}
		delete(f.chains, c)
		return "", nil
	}
	spec := rest[1:]
	if cmd == "-I" {
		if len(spec) == 0 || spec[0] != "1" {
			return "", fmt.Errorf("fake iptables: %q not supported", args)
		}
		spec = spec[1:]
	}
	r, err := ParseRule(argsText(spec))
	if err != nil {
		return "", fmt.Errorf("iptables: %w", err)
	}
	i := slices.IndexFunc(rules, func(o Rule) bool { return o.Text() == r.Text() })
	switch cmd {
	case "-C":
		if i < 0 {
			return "", fmt.Errorf("iptables: Bad rule (does a matching rule exist in that chain?)")
		}
		return "", nil
	case "-D":
		if i < 0 {
			return "", fmt.Errorf("iptables: Bad rule (does a matching rule exist in that chain?)")
		}
		f.chains[c] = slices.Delete(rules, i, i+1)
		return "", nil
	case "-I":
		return "", insert(f.chains, c, r, true)
	}
	return "", fmt.Errorf("fake iptables: %q not supported", args)
}

// argsText joins argv as restore text, quoting the word after --comment.
func argsText(argv []string) string {
	var b strings.Builder
	for i, a := range argv {
		if i > 0 {
			b.WriteByte(' ')
		}
		if i > 0 && argv[i-1] == "--comment" {
			a = `"` + a + `"`
		}
		b.WriteString(a)
	}
	return b.String()
}

func (f *Fake) list(table string) string {
	var b strings.Builder
	b.WriteString(f.userChains(table))
	for _, n := range f.names(table) {
		for i := range f.chains[Chain{table, n}] {
			fmt.Fprintf(&b, "-A %s %s\n", n, f.chains[Chain{table, n}][i].Text())
		}
	}
	return b.String()
}

// names returns the chains of table, sorted.
func (f *Fake) names(table string) []string {
	var out []string
	for c := range f.chains {
		if c.Table == table {
			out = append(out, c.Name)
		}
	}
	slices.Sort(out)
	return out
}

// SaveTable answers as iptables-save does for table ("" for all): each
// table with its chains declared, then its rules.
func (f *Fake) SaveTable(_ context.Context, table string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for _, t := range fakeTables {
		if table != "" && t != table {
			continue
		}
		fmt.Fprintf(&b, "*%s\n", t)
		for _, n := range f.names(t) {
			policy := "-"
			if Builtin(n) {
				policy = "ACCEPT"
			}
			fmt.Fprintf(&b, ":%s %s [0:0]\n", n, policy)
		}
		b.WriteString(f.list(t)[len(f.userChains(t)):])
		b.WriteString("COMMIT\n")
	}
	return b.String(), nil
}

// userChains is the "-N" lines of list(table).
func (f *Fake) userChains(table string) string {
	var b strings.Builder
	for _, n := range f.names(table) {
		if !Builtin(n) {
			fmt.Fprintf(&b, "-N %s\n", n)
		}
	}
	return b.String()
}

// Rules returns the rules of chain c and whether it exists.
func (f *Fake) Rules(c Chain) ([]Rule, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rules, ok := f.chains[c]
	return slices.Clone(rules), ok
}

// Dump returns the whole state: each table (filter, nat, mangle) that has
// a rule or a user chain, its chains sorted by name, each followed by its
// rules in order. Two Fakes with the same rules dump the same text.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for _, t := range fakeTables {
		names := f.names(t)
		if !slices.ContainsFunc(names, func(n string) bool { return !Builtin(n) || len(f.chains[Chain{t, n}]) > 0 }) {
			continue
		}
		fmt.Fprintf(&b, "*%s\n", t)
		for _, n := range names {
			fmt.Fprintf(&b, ":%s\n", n)
			for i := range f.chains[Chain{t, n}] {
				fmt.Fprintf(&b, "-A %s %s\n", n, f.chains[Chain{t, n}][i].Text())
			}
		}
	}
	return b.String()
}
