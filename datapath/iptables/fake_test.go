package iptables

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// fakeTables is an in-memory iptables for unit tests: tables of chains of
// rules (as iptables-restore text). It reads the restore text the
// datapath writes and lists chains as `iptables -t T -S` does, so a
// family's sync logic runs against it without root. A restore is all or
// nothing, like one transaction (the real one commits per table).
type fakeTables struct {
	chains   map[tableChain][]string
	restores int
	aborted  int // restores started and aborted
}

func newFakeTables() *fakeTables { return &fakeTables{chains: map[tableChain][]string{}} }

var _ tablesIO = (*fakeTables)(nil)

// StartRestore starts a restore whose input is applied at Commit.
func (k *fakeTables) StartRestore(context.Context) (restorer, error) {
	return &fakeRestore{k: k}, nil
}

// fakeRestore collects a restore's input; Abort drops it.
type fakeRestore struct {
	k     *fakeTables
	input []byte
}

func (r *fakeRestore) Write(p []byte) (int, error) {
	r.input = append(r.input, p...)
	return len(p), nil
}

func (r *fakeRestore) Commit() (xtables.RestoreStats, error) {
	return xtables.RestoreStats{}, r.k.RestoreNoFlush(context.Background(), r.input)
}

func (r *fakeRestore) Abort() { r.k.aborted++ }

// RestoreNoFlush applies an iptables-restore --noflush input.
func (k *fakeTables) RestoreNoFlush(_ context.Context, text []byte) error {
	next := maps.Clone(k.chains)
	for tc, rules := range next {
		next[tc] = slices.Clone(rules)
	}
	table := ""
	for i, l := range strings.Split(strings.TrimSuffix(string(text), "\n"), "\n") {
		if err := fakeLine(next, &table, l); err != nil {
			return &xtables.RestoreError{Line: i + 1, Err: fmt.Errorf("fake iptables-restore: line %d failed: %w", i+1, err)}
		}
	}
	k.chains = next
	k.restores++
	return nil
}

func fakeLine(chains map[tableChain][]string, table *string, l string) error {
	name, rest, _ := strings.Cut(l[min(len(l), 3):], " ")
	tc := tableChain{*table, name}
	switch {
	case strings.HasPrefix(l, "*"):
		*table = l[1:]
	case l == "COMMIT":
		*table = ""
	case strings.HasPrefix(l, ":"):
		n, _, _ := strings.Cut(l[1:], " ")
		chains[tableChain{*table, n}] = []string{}
	case strings.HasPrefix(l, "-A "):
		if _, ok := chains[tc]; !ok {
			return fmt.Errorf("chain %s does not exist", name)
		}
		if to := fakeTarget(rest); !builtinTarget(to) && !fakeHas(chains, tableChain{*table, to}) {
			return fmt.Errorf("target %s does not exist", to)
		}
		chains[tc] = append(chains[tc], rest)
	case strings.HasPrefix(l, "-I "):
		rule, _ := strings.CutPrefix(rest, "1 ")
		chains[tc] = slices.Insert(chains[tc], 0, rule)
	case strings.HasPrefix(l, "-X "):
		if len(chains[tc]) > 0 {
			return fmt.Errorf("chain %s is not empty", name)
		}
		for from, rules := range chains {
			for _, r := range rules {
				if from.table == *table && fakeTarget(r) == name {
					return fmt.Errorf("chain %s is referenced by %s", name, from.name)
				}
			}
		}
		delete(chains, tc)
	default:
		return fmt.Errorf("cannot parse %q", l)
	}
	return nil
}

func fakeHas(chains map[tableChain][]string, tc tableChain) bool {
	_, ok := chains[tc]
	return ok
}

// fakeTarget returns what a rule jumps to (the word after its last -j).
func fakeTarget(rule string) string {
	i := strings.LastIndex(rule, "-j ")
	to, _, _ := strings.Cut(rule[i+3:], " ")
	return to
}

func builtinTarget(t string) bool {
	switch t {
	case "DNAT", "MARK", "MASQUERADE", "RETURN", "ACCEPT", "DROP", "REJECT":
		return true
	}
	return false
}

// Run answers `-t TABLE -S` as iptables does: "-N" for each user chain,
// then every rule.
func (k *fakeTables) Run(_ context.Context, args ...string) (string, error) {
	if len(args) != 3 || args[0] != "-t" || args[2] != "-S" {
		return "", fmt.Errorf("fake iptables: %q not supported", args)
	}
	var b strings.Builder
	names := k.names(args[1])
	for _, n := range names {
		if !builtin(n) {
			fmt.Fprintf(&b, "-N %s\n", n)
		}
	}
	for _, n := range names {
		for _, r := range k.chains[tableChain{args[1], n}] {
			fmt.Fprintf(&b, "-A %s %s\n", n, r)
		}
	}
	return b.String(), nil
}

func (k *fakeTables) names(table string) []string {
	var out []string
	for tc := range k.chains {
		if tc.table == table {
			out = append(out, tc.name)
		}
	}
	slices.Sort(out)
	return out
}

// Dump returns the whole state, chains sorted by table and name, each
// followed by its rules in order.
func (k *fakeTables) Dump() string {
	var b strings.Builder
	for _, t := range tables {
		fmt.Fprintf(&b, "*%s\n", t)
		for _, n := range k.names(t) {
			fmt.Fprintf(&b, ":%s\n", n)
			for _, r := range k.chains[tableChain{t, n}] {
				fmt.Fprintf(&b, "-A %s %s\n", n, r)
			}
		}
	}
	return b.String()
}

// newFakeFamily is a family of cfg whose tables are k, with the built-in
// chains present.
func newFakeFamily(cfg Config, k *fakeTables) *family {
	for _, tc := range []tableChain{{tableNAT, "PREROUTING"}, {tableNAT, "OUTPUT"}, {tableNAT, "POSTROUTING"}, {tableFilter, "INPUT"}, {tableFilter, "FORWARD"}, {tableFilter, "OUTPUT"}} {
		if _, ok := k.chains[tc]; !ok {
			k.chains[tc] = []string{}
		}
	}
	return &family{cfg: cfg, io: k, log: discardLog}
}
