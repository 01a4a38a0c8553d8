package datapath

import (
	"net/netip"
	"reflect"
	"testing"
)

// A plan out of Compare's order (against Plan's contract) cannot be read by
// name: a conflict that a later plan's change brings is still found.
func TestSanitizerUnsortedPlan(t *testing.T) {
	a := ServicePortName{Namespace: "a", Name: "x"}
	b := ServicePortName{Namespace: "b", Name: "y"}
	fe := func(svc ServicePortName, last byte) Frontend {
		return Frontend{Service: svc, Kind: ClusterIP, Protocol: TCP, Family: IPv4, Port: 80,
			Addr: netip.AddrFrom4([4]byte{10, 96, 0, last})}
	}
	var s Sanitizer
	first := &Plan{Generation: 1, Frontends: []Frontend{fe(b, 2), fe(a, 1)}}
	if r := s.Sanitize(first, nil); r != nil {
		t.Fatalf("no conflict yet, refused %v", r)
	}
	// b moves onto a's address.
	next := &Plan{Generation: 2, Frontends: []Frontend{fe(b, 1), fe(a, 1)}, Changed: map[ServicePortName]bool{b: true}}
	whole := &Plan{Frontends: []Frontend{fe(b, 1), fe(a, 1)}}
	got, want := s.Sanitize(next, nil), whole.Sanitize(nil)
	if len(want) != 1 || !reflect.DeepEqual(got, want) || !reflect.DeepEqual(next.Frontends, whole.Frontends) {
		t.Fatalf("Sanitizer refused %v and left\n%s\nSanitize %v and\n%s", got, next, want, whole)
	}
}
