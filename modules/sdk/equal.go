package sdk

// Equal reports whether a and b are equal, like a == b, but with few jumps
// and no byte loop: inside a wasm guest whose host enforces a deadline,
// every loop iteration and every jump of Go's code costs as much as a
// dozen plain instructions, and a == b compares byte by byte in a loop.
// Worth it for the short strings modules compare per endpoint (node names,
// zones); == is as good for the rest.
func Equal(a, b string) bool {
	n := len(a)
	switch {
	case n != len(b):
		return false
	case n >= 8:
		return equalLong(a, b)
	case n >= 4:
		// Two windows of 4 that cover 4 to 7 bytes.
		return (le32(a, 0)^le32(b, 0))|(le32(a, n-4)^le32(b, n-4)) == 0
	case n == 0:
		return true
	}
	// 1 to 3 bytes: first, middle and last cover them all.
	return (a[0]^b[0])|(a[n/2]^b[n/2])|(a[n-1]^b[n-1]) == 0
}

// equalLong compares two strings of the same length of at least 8, 8
// bytes at a time; the last window may overlap the one before.
func equalLong(a, b string) bool {
	n := len(a)
	for i := 0; i < n-8; i += 8 {
		if le64(a, i) != le64(b, i) {
			return false
		}
	}
	return le64(a, n-8) == le64(b, n-8)
}

func le32(s string, i int) uint32 {
	s = s[i : i+4]
	return uint32(s[0]) | uint32(s[1])<<8 | uint32(s[2])<<16 | uint32(s[3])<<24
}

func le64(s string, i int) uint64 {
	s = s[i : i+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// HasPrefix reports whether s begins with prefix, with Equal.
func HasPrefix(s, prefix string) bool {
	return len(s) >= len(prefix) && Equal(s[:len(prefix)], prefix)
}
