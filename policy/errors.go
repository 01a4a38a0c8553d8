package policy

import (
	"errors"
	"fmt"
)

// Reason classifies a failed call; it is the "reason" label of the failure
// metric.
type Reason string

const (
	// ReasonTrap: the guest trapped, exited or failed to instantiate.
	ReasonTrap Reason = "trap"
	// ReasonTimeout: the call ran past its deadline.
	ReasonTimeout Reason = "timeout"
	// ReasonInvalid: the output broke the ABI rules (length, range,
	// scheduler, encoding, all-zero where not allowed) or the module
	// reported a failure.
	ReasonInvalid Reason = "invalid"
	// ReasonCircuitOpen: the module was not called because it failed
	// repeatedly, or its instance is waiting to be re-created.
	ReasonCircuitOpen Reason = "circuit_open"
	// ReasonCanceled: the caller's context ended; not the module's fault
	// and not counted against it.
	ReasonCanceled Reason = "canceled"
)

// ErrCircuitOpen is wrapped by CallErrors of ReasonCircuitOpen.
var ErrCircuitOpen = errors.New("circuit open")

// CallError is returned by Instance.Evaluate when a module fails.
type CallError struct {
	Module string
	Reason Reason
	Err    error
}

func (e *CallError) Error() string {
	return fmt.Sprintf("policy: module %s: %s: %v", e.Module, e.Reason, e.Err)
}

func (e *CallError) Unwrap() error { return e.Err }

// ReasonOf returns the reason of a CallError in err's chain, or "" when
// there is none.
func ReasonOf(err error) Reason {
	var ce *CallError
	if errors.As(err, &ce) {
		return ce.Reason
	}
	return ""
}
