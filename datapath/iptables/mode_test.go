package iptables

import "testing"

// TestDecideMode: what one family's apply does in each situation, and
// whether the tamper check (kernelMoved) is paid for.
func TestDecideMode(t *testing.T) {
	applied := modeInput{applied: true}
	compare := modeInput{applied: true, compare: true}
	for _, tc := range []struct {
		name  string
		in    modeInput
		moved bool // kernelMoved's answer
		want  syncMode
		asked bool // kernelMoved was asked
	}{
		{"first apply of a partial plan adopts what is there", modeInput{}, false, modeRewrite, false},
		{"first apply of a compare plan", modeInput{compare: true}, true, modeRewrite, false},
		{"after a failed apply", modeInput{applied: true, owed: true}, false, modeRewrite, false},
		{"after a failed apply, a compare plan", modeInput{applied: true, owed: true, compare: true}, false, modeRewrite, false},
		{"periodic rewrite due, partial plan", modeInput{applied: true, rewriteDue: true}, false, modeRewrite, false},
		{"periodic rewrite due, compare plan", modeInput{applied: true, rewriteDue: true, compare: true}, false, modeRewrite, false},
		{"a change", applied, true, modePartial, false},
		{"a compare of a kernel that did not move", compare, false, modeCompare, true},
		{"a compare of a kernel that moved (or could not be checked)", compare, true, modeRewrite, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			asked := false
			got := decideMode(tc.in, func() bool { asked = true; return tc.moved })
			if got != tc.want || asked != tc.asked {
				t.Errorf("decideMode(%+v) = %v (kernel asked: %v), want %v (asked: %v)", tc.in, got, asked, tc.want, tc.asked)
			}
		})
	}
}

func TestSyncModeString(t *testing.T) {
	for m, want := range map[syncMode]string{modePartial: "partial", modeCompare: "compare", modeRewrite: "rewrite", 9: "syncMode(?)"} {
		if got := m.String(); got != want {
			t.Errorf("syncMode(%d).String() = %q, want %q", m, got, want)
		}
	}
}
