// Package fault holds the fault suite of docs/reliability.md ("Faults"):
// each test makes one part of the machine fail the way it fails in the
// field (the xtables lock held, the state directory full, the clock
// stepped) with real parts (namespaces, iptables, tmpfs), and asserts what
// happened and that nothing else was lost.
package fault
