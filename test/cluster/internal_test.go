package cluster

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

func TestNamespaceName(t *testing.T) {
	label := regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	for _, tc := range []struct {
		test string
		seq  uint64
		want string
	}{
		{"TestFoo", 1, "testfoo-1"},
		{"TestFoo/sub_case#01", 12, "testfoo-sub-case-01-12"},
		{"///", 3, "test-3"},
		{"TestAVeryLongNameThatGoesOnAndOnAndOnBeyondSixtyThreeCharacters/and/more", 99999, "testaverylongnamethatgoesonandonandonbeyondsixtyth-99999"},
	} {
		got := namespaceName(tc.test, tc.seq)
		if got != tc.want {
			t.Errorf("namespaceName(%q, %d) = %q, want %q", tc.test, tc.seq, got, tc.want)
		}
		if len(got) > 63 || !label.MatchString(got) {
			t.Errorf("namespaceName(%q, %d) = %q is not a DNS label", tc.test, tc.seq, got)
		}
	}
}

func TestTailFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	if err := os.WriteFile(p, []byte("a\nb\nc\nd\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for n, want := range map[int]string{1: "d", 2: "c\nd", 4: "a\nb\nc\nd", 10: "a\nb\nc\nd"} {
		if got := tailFile(p, n); got != want {
			t.Errorf("tailFile(%d) = %q, want %q", n, got, want)
		}
	}
}
