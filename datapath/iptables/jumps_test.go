package iptables

import (
	"slices"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/xtables"
)

// chainJumps returns jumps()'s jumps from table/chain, in their order.
func chainJumps(fam datapath.Family, table, chain string) []xtables.Jump {
	var out []xtables.Jump
	for _, j := range jumps(fam) {
		if j.Table == table && j.Chain == chain {
			out = append(out, j)
		}
	}
	return out
}

// listing renders the filter table's `iptables -S` with chain's rules,
// another built-in chain's and one of ours between them, each holding our
// jumps in the reverse order: only chain's rules count.
func listing(chain string, rules []string) []string {
	other := "FORWARD"
	if chain == other {
		other = "OUTPUT"
	}
	l := []string{"-P INPUT ACCEPT", "-P FORWARD ACCEPT", "-P OUTPUT ACCEPT", "-N EP-SERVICES"}
	for _, j := range slices.Backward(chainJumps(datapath.IPv4, xtables.Filter, other)) {
		l = append(l, ruleOf(j))
	}
	l = append(l, rules...)
	for _, j := range slices.Backward(chainJumps(datapath.IPv4, xtables.Filter, chain)) {
		l = append(l, "-A EP-SERVICES "+strings.Join(j.Rule.Args(), " "))
	}
	return l
}

// ruleOf is how `iptables -S` prints jump j.
func ruleOf(j xtables.Jump) string {
	return "-A " + j.Chain + " " + strings.Join(j.Rule.Args(), " ")
}

// reorder runs orderJumps's moves on rules (one chain's, as `iptables -S`
// prints them, without the policy) as the kernel would: insert at a rule
// number, delete the first rule of that text. It returns the rules and the
// moves made.
func reorder(t *testing.T, chain string, rules []string, js []xtables.Jump) ([]string, int) {
	t.Helper()
	moves := 0
	for range len(js) {
		j, at, ok := misplaced(listing(chain, rules), chain, js)
		if !ok {
			return rules, moves
		}
		moves++
		if at < 1 || at > len(rules)+1 {
			t.Fatalf("insert at rule %d of %d", at, len(rules))
		}
		r := ruleOf(j)
		rules = slices.Insert(slices.Clone(rules), at-1, r)
		i := slices.Index(rules, r)
		rules = slices.Delete(rules, i, i+1)
	}
	if _, _, ok := misplaced(listing(chain, rules), chain, js); ok {
		t.Fatalf("still misplaced after %d moves: %q", len(js), rules)
	}
	return rules, moves
}

// TestMisplacedJumps: from every order of filter INPUT's five IPv4 jumps
// (the localnet drop first), with another program's rules among them and
// one jump missing or listed twice, at most four moves put our jumps in
// jumps()'s order, keep the other rules' order, and none is made when the
// order is right.
func TestMisplacedJumps(t *testing.T) {
	js := chainJumps(datapath.IPv4, xtables.Filter, "INPUT")
	if len(js) != 5 || js[0].To() != chainLocalnet {
		t.Fatalf("filter INPUT's IPv4 jumps: %v, want 5, the localnet drop first", js)
	}
	foreign := []string{"-A INPUT -s 192.0.2.1/32 -j ACCEPT", "-A INPUT -i lo -j ACCEPT"}
	want := make([]string, len(js))
	for i, j := range js {
		want[i] = ruleOf(j)
	}
	perms := permutations(len(js))
	if len(perms) != 120 {
		t.Fatalf("%d permutations of 5", len(perms))
	}
	for _, perm := range perms {
		for _, variant := range []string{"plain", "foreign", "missing", "twice"} {
			var rules []string
			for k, i := range perm {
				if variant == "missing" && i == 2 {
					continue
				}
				rules = append(rules, want[i])
				if variant == "foreign" && k < len(foreign) {
					rules = append(rules, foreign[k])
				}
			}
			if variant == "twice" {
				rules = append(rules, want[perm[0]])
			}
			got, moves := reorder(t, "INPUT", rules, js)
			if moves > len(js)-1 {
				t.Errorf("%v %s: %d moves", perm, variant, moves)
			}
			var ours, others []string
			for _, r := range got {
				if slices.Contains(want, r) {
					if !slices.Contains(ours, r) {
						ours = append(ours, r)
					}
				} else {
					others = append(others, r)
				}
			}
			wantOurs := slices.DeleteFunc(slices.Clone(want), func(r string) bool { return variant == "missing" && r == want[2] })
			if !slices.Equal(ours, wantOurs) {
				t.Errorf("%v %s: our jumps end %q, want %q", perm, variant, ours, wantOurs)
			}
			if variant == "foreign" && !slices.Equal(others, foreign) {
				t.Errorf("%v %s: the other rules end %q, want %q", perm, variant, others, foreign)
			}
			if len(got) != len(rules) {
				t.Errorf("%v %s: %d rules after, %d before", perm, variant, len(got), len(rules))
			}
			if slices.Equal(perm, []int{0, 1, 2, 3, 4}) && moves != 0 {
				t.Errorf("%s: %d moves for jumps in order", variant, moves)
			}
		}
	}
	// An older version's order: the localnet drop after the service
	// portals' reject. The first move puts the service portals' jump
	// right after it.
	old := []string{want[1], want[2], want[3], want[4], want[0]}
	j, at, ok := misplaced(listing("INPUT", old), "INPUT", js)
	if !ok || j.To() != chainServices || at != 6 {
		t.Errorf("misplaced(%q) = %s at %d %v, want %s at 6 (after the localnet drop)", old, j.To(), at, ok, chainServices)
	}
}

// permutations returns every order of 0..n-1.
func permutations(n int) [][]int {
	if n == 0 {
		return [][]int{{}}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for i := 0; i <= len(p); i++ {
			q := slices.Insert(slices.Clone(p), i, n-1)
			out = append(out, q)
		}
	}
	return out
}
