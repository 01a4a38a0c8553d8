package sdk

import "testing"

func TestEqual(t *testing.T) {
	words := []string{"", "a", "b", "ab", "ba", "abc", "abd", "xbc", "zone", "zonf", "ap-1", "eu-1", "eu-2", "fu-1", "ap-1a", "eu-1a", "eu-1b", "zone-a", "zone-b", "yone-a", "zone-a1",
		"edge-10", "edge-11", "12345678", "12345679", "02345678", "123456789", "123456788", "023456789", "1234567890abcdef", "1234567890abcdeg", "1234567890abcdef1"}
	// Every length up to 20, differing in each single position.
	for n := range 21 {
		base := make([]byte, n)
		for i := range base {
			base[i] = byte('a' + i)
		}
		words = append(words, string(base))
		for i := range n {
			w := []byte(string(base))
			w[i] ^= 0x40
			words = append(words, string(w))
		}
	}
	for _, a := range words {
		for _, b := range words {
			if got := Equal(a, b); got != (a == b) {
				t.Errorf("Equal(%q, %q) = %v", a, b, got)
			}
			// Same bytes at another address.
			if got := Equal(a, string([]byte(b))); got != (a == b) {
				t.Errorf("Equal(%q, copy of %q) = %v", a, b, got)
			}
			want := len(a) >= len(b) && a[:len(b)] == b
			if got := HasPrefix(a, b); got != want {
				t.Errorf("HasPrefix(%q, %q) = %v", a, b, got)
			}
		}
	}
}
