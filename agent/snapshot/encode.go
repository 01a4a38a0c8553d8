package snapshot

import (
	"bufio"
	"encoding/json"
	"slices"
	"strings"

	"github.com/edgeproxy/edgeproxy/datapath"
)

// encoder writes a payload as json.Marshal lays it out, one object at a
// time, so that no buffer ever holds the whole of it.
//
// Why: json.Marshal encodes into a buffer it takes from, and gives back
// to, a sync.Pool. For a whole snapshot that buffer is the size of the
// file (28 MB at 10,000 Services × 10 endpoints), and a pool's items
// outlive a GC: on a quiet agent, which collects rarely, every write left
// one resident. A Service, a slice or a frontend at a time, the pooled
// buffer stays a few KB; TestEncodeIsMarshal holds the bytes to
// json.Marshal's.
type encoder struct {
	w   *bufio.Writer
	err error // the first encoding error; write errors stay in w
}

func (e *encoder) raw(s string) { _, _ = e.w.WriteString(s) }

func (e *encoder) value(v any) {
	if e.err != nil {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		e.err = err
		return
	}
	_, _ = e.w.Write(b)
}

// list writes l as json.Marshal does: null when nil, else its items.
func list[T any](e *encoder, l []T) {
	if l == nil {
		e.raw("null")
		return
	}
	e.raw("[")
	for i := range l {
		if i > 0 {
			e.raw(",")
		}
		e.value(&l[i])
	}
	e.raw("]")
}

// snapshot writes s: Snapshot's fields in their order, with their tags.
func (e *encoder) snapshot(s *Snapshot) {
	e.raw(`{"written":`)
	e.value(s.Written)
	e.raw(`,"node":`)
	e.value(&s.Node)
	e.raw(`,"services":`)
	list(e, s.Services)
	e.raw(`,"slices":`)
	list(e, s.Slices)
	if len(s.Modules) > 0 {
		e.raw(`,"modules":`)
		e.value(s.Modules)
	}
	e.raw(`,"plan":`)
	e.plan(&s.Plan)
	if len(s.Resume) > 0 {
		e.raw(`,"resume":`)
		e.value(s.Resume)
	}
	e.raw("}")
}

// plan writes p: datapath.Plan's fields in their order (no tags but
// PodCIDRs' omitempty).
func (e *encoder) plan(p *datapath.Plan) {
	e.raw(`{"Generation":`)
	e.value(p.Generation)
	e.raw(`,"Frontends":`)
	list(e, p.Frontends)
	e.raw(`,"Changed":`)
	e.changed(p.Changed)
	e.raw(`,"Full":`)
	e.value(p.Full)
	e.raw(`,"NodeIPs":`)
	e.value(p.NodeIPs)
	if len(p.PodCIDRs) > 0 {
		e.raw(`,"PodCIDRs":`)
		e.value(p.PodCIDRs)
	}
	e.raw(`,"HealthCheckPorts":`)
	e.value(p.HealthCheckPorts)
	e.raw("}")
}

// changed writes the set of changed ports (every port, after a cold
// start) as json.Marshal writes a map: keys in their text form, sorted.
func (e *encoder) changed(m map[datapath.ServicePortName]bool) {
	if m == nil {
		e.raw("null")
		return
	}
	type entry struct {
		key string
		v   bool
	}
	l := make([]entry, 0, len(m))
	for k, v := range m {
		l = append(l, entry{k.String(), v})
	}
	slices.SortFunc(l, func(a, b entry) int { return strings.Compare(a.key, b.key) })
	e.raw("{")
	for i, en := range l {
		if i > 0 {
			e.raw(",")
		}
		e.value(en.key)
		if en.v {
			e.raw(":true")
		} else {
			e.raw(":false")
		}
	}
	e.raw("}")
}
