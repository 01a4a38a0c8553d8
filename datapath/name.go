package datapath

import (
	"errors"
	"fmt"
	"strings"
)

// ServicePortName identifies one port of one service, as kube-proxy's
// proxy.ServicePortName does: a comparable key that maps, plans and
// backends use as is. Its String form, "namespace/name:port", is for the
// edges only: logs, status and explain output, metric labels, kernel
// object names and comments, and the JSON of plans and snapshots
// (MarshalText).
type ServicePortName struct {
	Namespace string
	Name      string
	Port      string // the port's name; empty for a service's only, unnamed port
}

// String is "namespace/name:port", or "namespace/name" for an unnamed port.
func (n ServicePortName) String() string {
	if n.Port == "" {
		return n.Namespace + "/" + n.Name
	}
	return n.Namespace + "/" + n.Name + ":" + n.Port
}

// AppendText appends the String form to b.
func (n ServicePortName) AppendText(b []byte) ([]byte, error) {
	b = append(append(append(b, n.Namespace...), '/'), n.Name...)
	if n.Port != "" {
		b = append(append(b, ':'), n.Port...)
	}
	return b, nil
}

// Compare orders names as their String forms order, byte by byte, without
// building them: kernel rule order and golden plans follow that order.
func (n ServicePortName) Compare(m ServicePortName) int {
	// Fast paths: where the first differing part is not a prefix of the
	// other, or only the ports differ, the parts compare as the whole.
	switch {
	case n.Namespace != m.Namespace:
		if !strings.HasPrefix(n.Namespace, m.Namespace) && !strings.HasPrefix(m.Namespace, n.Namespace) {
			return strings.Compare(n.Namespace, m.Namespace)
		}
	case n.Name != m.Name:
		if !strings.HasPrefix(n.Name, m.Name) && !strings.HasPrefix(m.Name, n.Name) {
			return strings.Compare(n.Name, m.Name)
		}
	case n.Port == m.Port:
		return 0
	case n.Port == "":
		return -1
	case m.Port == "":
		return 1
	default:
		return strings.Compare(n.Port, m.Port)
	}
	return n.compareJoined(m)
}

// compareJoined compares the String forms byte by byte without building
// them.
func (n ServicePortName) compareJoined(m ServicePortName) int {
	a, b := n.parts(), m.parts()
	ai, bi := 0, 0 // the part being read
	ao, bo := 0, 0 // the offset in it
	for {
		for ai < len(a) && ao == len(a[ai]) {
			ai, ao = ai+1, 0
		}
		for bi < len(b) && bo == len(b[bi]) {
			bi, bo = bi+1, 0
		}
		switch {
		case ai == len(a) && bi == len(b):
			return 0
		case ai == len(a):
			return -1
		case bi == len(b):
			return 1
		}
		if ca, cb := a[ai][ao], b[bi][bo]; ca != cb {
			if ca < cb {
				return -1
			}
			return 1
		}
		ao, bo = ao+1, bo+1
	}
}

// parts are the pieces String joins.
func (n ServicePortName) parts() [5]string {
	if n.Port == "" {
		return [5]string{n.Namespace, "/", n.Name}
	}
	return [5]string{n.Namespace, "/", n.Name, ":", n.Port}
}

// MarshalText writes the String form, which keeps the JSON of plans,
// snapshots and status a string per service port, as it always was.
func (n ServicePortName) MarshalText() ([]byte, error) {
	return n.AppendText(make([]byte, 0, len(n.Namespace)+len(n.Name)+len(n.Port)+2))
}

// errBadName is the cause of every name UnmarshalText refuses.
var errBadName = errors.New(`want "namespace/name" or "namespace/name:port"`)

// UnmarshalText reads the String form back: the one parser of it, for JSON
// from outside (snapshots on disk, /debug/status read by the CLI). A
// namespace holds no '/' and a name no ':' (Kubernetes names are DNS
// labels and subdomains), so the form is unambiguous.
func (n *ServicePortName) UnmarshalText(b []byte) error {
	s := string(b)
	ns, rest, ok := strings.Cut(s, "/")
	if !ok || ns == "" || strings.Contains(rest, "/") {
		return fmt.Errorf("datapath: service port name %q: %w", s, errBadName)
	}
	name, port, named := strings.Cut(rest, ":")
	if name == "" || named && port == "" || strings.Contains(port, ":") {
		return fmt.Errorf("datapath: service port name %q: %w", s, errBadName)
	}
	*n = ServicePortName{Namespace: ns, Name: name, Port: port}
	return nil
}
