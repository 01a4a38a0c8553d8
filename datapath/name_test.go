package datapath

import (
	"encoding/json"
	"strings"
	"testing"
)

// names holds the orderings where comparing fields one by one and
// comparing the joined strings disagree ('-' and '.' sort before '/' and
// ':'), and the unnamed port.
var names = []ServicePortName{
	{Namespace: "a", Name: "b"},
	{Namespace: "a", Name: "b", Port: "x"},
	{Namespace: "a", Name: "b-c"},
	{Namespace: "a", Name: "b.c", Port: "y"},
	{Namespace: "a-b", Name: "b"},
	{Namespace: "a.b", Name: "a"},
	{Namespace: "ab", Name: "a", Port: "http"},
	{Namespace: "default", Name: "web", Port: "http"},
	{Namespace: "default", Name: "web", Port: "http-alt"},
	{Namespace: "default", Name: "web-0"},
	{},
}

func TestServicePortNameCompareFollowsString(t *testing.T) {
	for _, a := range names {
		for _, b := range names {
			want := strings.Compare(a.String(), b.String())
			if got := a.Compare(b); got != want {
				t.Errorf("%q.Compare(%q) = %d, want %d (as the strings compare)", a, b, got, want)
			}
		}
	}
}

func TestServicePortNameText(t *testing.T) {
	for _, n := range names[:len(names)-1] {
		b, err := json.Marshal(map[ServicePortName]ServicePortName{n: n})
		if err != nil {
			t.Fatal(err)
		}
		want := `{"` + n.String() + `":"` + n.String() + `"}`
		if string(b) != want {
			t.Errorf("JSON of %#v = %s, want %s", n, b, want)
		}
		var back map[ServicePortName]ServicePortName
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("read back %s: %v", b, err)
		}
		if back[n] != n {
			t.Errorf("read back %s = %#v, want %#v", b, back, n)
		}
	}
	for _, bad := range []string{"", "web", "/web", "a/", "a/b/c", "a/b:", "a/b:c:d", "a/:p"} {
		var n ServicePortName
		if err := n.UnmarshalText([]byte(bad)); err == nil {
			t.Errorf("UnmarshalText(%q) = %#v, want an error", bad, n)
		}
	}
}

// FuzzServicePortNameText: what UnmarshalText accepts, String writes back
// unchanged, and Compare agrees with the strings' order.
func FuzzServicePortNameText(f *testing.F) {
	f.Add("default/web:http", "default/web-0")
	f.Add("a/b", "a-b/c:d")
	f.Fuzz(func(t *testing.T, s1, s2 string) {
		var a, b ServicePortName
		if a.UnmarshalText([]byte(s1)) != nil || b.UnmarshalText([]byte(s2)) != nil {
			return
		}
		if a.String() != s1 || b.String() != s2 {
			t.Fatalf("round trip: %q -> %q, %q -> %q", s1, a, s2, b)
		}
		if got, want := a.Compare(b), strings.Compare(s1, s2); got != want {
			t.Fatalf("Compare(%q, %q) = %d, want %d", s1, s2, got, want)
		}
	})
}
