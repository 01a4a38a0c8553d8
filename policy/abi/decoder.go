package abi

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"unsafe"
)

// Decoder decodes inputs like DecodeInput, but built for a wasm guest,
// where every taken branch and every call is expensive (a runtime that
// enforces deadlines, such as wazero's, checks at each loop iteration, and
// Go's wasm code loops back to its block dispatcher on each jump) and an
// allocation is a long walk through the allocator:
//
//   - The input is copied into an arena that is only ever appended to; every
//     string of the result points into it. A new arena is allocated only
//     when the current one is full (about once every hundred calls), and an
//     old one lives on while a string still points into it, so strings stay
//     valid and immutable for as long as they are referenced.
//   - Decoding is one straight pass of inlined reads with no error
//     bookkeeping; only when that pass fails does the precise decoder run
//     again to say why.
//
// The zero value is ready; not safe for concurrent use.
type Decoder struct {
	arena []byte
}

// arenaSize is the size of a new arena: large against an input (a few
// hundred bytes for ten endpoints), small against the 16 MiB memory cap.
const arenaSize = 8 << 10

// DecodeInput decodes b into in, reusing in's slices. It keeps its own copy
// of b.
func (d *Decoder) DecodeInput(b []byte, in *Input) error {
	// The arena is only appended to, so its bytes past its length are
	// still zero: the spare bytes decodeFast reads past the input.
	if cap(d.arena)-len(d.arena) < len(b)+spare {
		d.arena = make([]byte, 0, max(arenaSize, len(b)+spare))
	}
	off := len(d.arena)
	d.arena = append(d.arena, b...)
	if decodeFast(d.arena[off:cap(d.arena)], len(b), in) {
		return nil
	}
	return decodeInput(&reader{b: d.arena[off:len(d.arena)], alias: true}, in)
}

// The fast decoder reads b through full, the same bytes extended by at
// least spare bytes of zeroed capacity, so that reads near the end need no
// checks of their own: a read that runs past the input is clamped to its
// end and counted in an overflow that the caller checks once. Inlined reads
// without branches matter in a guest: there each jump costs more than a
// dozen plain instructions.
const spare = 8

// fstr reads a str at p (p <= size) and returns it, the offset after it
// (at most size) and a value that is negative when the str ran past size.
// Clamping is done with arithmetic, not min and max, which compile to
// jumps in Go's wasm code.
func fstr(full []byte, p, size int) (string, int, int) {
	n := int(full[p]) | int(full[p+1])<<8
	q := p + 2 + n
	d := size - q
	m := d >> 63 // -1 when q > size
	q += d & m
	n = q - p - 2
	n &^= n >> 63 // 0 when p+2 > size
	return unsafe.String(&full[p+2], n), q, m
}

// clamp returns min(p, size) without a jump, and a value that is negative
// when p > size.
func clamp(p, size int) (int, int) {
	d := size - p
	m := d >> 63
	return p + d&m, m
}

// fstrs reads a strs at p into dst[:0]; nil when empty.
func fstrs(full []byte, p, size int, dst []string) ([]string, int, int) {
	n := int(full[p]) | int(full[p+1])<<8
	p, over := clamp(p+2, size)
	if n == 0 {
		return nil, p, over
	}
	if n > size-p {
		return nil, p, -1
	}
	dst = dst[:0]
	for range n {
		var s string
		var o int
		s, p, o = fstr(full, p, size)
		over |= o
		dst = append(dst, s)
	}
	return dst, p, over
}

// fkvs reads a kvs at p into dst[:0]; nil when empty.
func fkvs(full []byte, p, size int, dst []KV) ([]KV, int, int) {
	n := int(full[p]) | int(full[p+1])<<8
	p, over := clamp(p+2, size)
	if n == 0 {
		return nil, p, over
	}
	if n > size-p {
		return nil, p, -1
	}
	dst = dst[:0]
	for range n {
		var k, v string
		var o1, o2 int
		k, p, o1 = fstr(full, p, size)
		v, p, o2 = fstr(full, p, size)
		over |= o1 | o2
		dst = append(dst, KV{k, v})
	}
	return dst, p, over
}

// decodeFast decodes the first size bytes of full into in; false means
// they are not a valid input (in is then partly written, with strings that
// still point into full).
func decodeFast(full []byte, size int, in *Input) bool {
	if size < 4 || len(full) < size+spare || binary.LittleEndian.Uint32(full) != Version {
		return false
	}
	p, o1, o2, o3, o4 := 4, 0, 0, 0, 0
	s := &in.Service
	s.Namespace, p, o1 = fstr(full, p, size)
	s.Name, p, o2 = fstr(full, p, size)
	s.PortName, p, o3 = fstr(full, p, size)
	s.Protocol, p, o4 = fstr(full, p, size)
	over := o1 | o2 | o3 | o4
	s.Port = uint16(full[p]) | uint16(full[p+1])<<8
	p, o1 = clamp(p+2, size)
	over |= o1
	s.Labels, p, o1 = fkvs(full, p, size, s.Labels)
	s.Annotations, p, o2 = fkvs(full, p, size, s.Annotations)
	n := &in.Node
	n.Name, p, o3 = fstr(full, p, size)
	n.Zone, p, o4 = fstr(full, p, size)
	over |= o1 | o2 | o3 | o4
	n.Region, p, o1 = fstr(full, p, size)
	n.Labels, p, o2 = fkvs(full, p, size, n.Labels)
	over |= o1 | o2
	if over < 0 || p+4 > size {
		return false
	}
	cnt := int(binary.LittleEndian.Uint32(full[p:]))
	p += 4
	if cnt > (size-p)/10 { // an endpoint takes at least 10 bytes
		return false
	}
	in.Endpoints = slices.Grow(in.Endpoints[:0], cnt)[:cnt]
	for i := range in.Endpoints {
		e := &in.Endpoints[i]
		f, al := full[p], int(full[p+1])
		p += 2
		if p+al+6 > size || (al != 4 && al != 16 && al != 0) {
			return false
		}
		e.Ready = f&FlagReady != 0
		e.Serving = f&FlagServing != 0
		e.Terminating = f&FlagTerminating != 0
		e.Local = f&FlagLocal != 0
		switch al {
		case 4:
			e.Addr = netip.AddrFrom4([4]byte(full[p : p+4]))
		case 16:
			e.Addr = netip.AddrFrom16([16]byte(full[p : p+16]))
		default:
			e.Addr = netip.Addr{}
		}
		p += al
		e.Port = uint16(full[p]) | uint16(full[p+1])<<8
		e.Weight = binary.LittleEndian.Uint32(full[p+2:])
		e.NodeName, p, o1 = fstr(full, p+6, size)
		e.Zone, p, o2 = fstr(full, p, size)
		// Topology hints: none or one (the common cases) without a call.
		var h string
		switch int(full[p]) | int(full[p+1])<<8 {
		case 0:
			e.HintZones = nil
			p, o3 = clamp(p+2, size)
		case 1:
			// The count fits: a str takes at least 2 more bytes.
			h, p, o3 = fstr(full, p+2, size)
			e.HintZones = append(e.HintZones[:0], h)
		default:
			e.HintZones, p, o3 = fstrs(full, p, size, e.HintZones)
		}
		over |= o3
		switch int(full[p]) | int(full[p+1])<<8 {
		case 0:
			e.HintNodes = nil
			p, o4 = clamp(p+2, size)
		case 1:
			h, p, o4 = fstr(full, p+2, size)
			e.HintNodes = append(e.HintNodes[:0], h)
		default:
			e.HintNodes, p, o4 = fstrs(full, p, size, e.HintNodes)
		}
		over |= o1 | o2 | o3 | o4
	}
	return over >= 0 && p == size
}
