package snapshot

import (
	"errors"
	"testing"
)

// FuzzDecode: any bytes as a snapshot file decode to a verified snapshot
// with a valid plan, or to ErrCorrupt / ErrIncompatible; never a panic.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte("edgeproxy-snapshot v1 sha256:00\n{}"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := decode(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrIncompatible) {
				t.Fatalf("error of no known kind: %v", err)
			}
			return
		}
		if verr := s.Plan.Validate(); verr != nil {
			t.Fatalf("accepted an invalid plan: %v", verr)
		}
	})
}
