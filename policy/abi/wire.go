package abi

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"slices"
	"unicode/utf8"
	"unsafe"
)

// KV is one label or annotation. Lists of KV are sorted by key.
type KV struct{ Key, Value string }

// Lookup returns the value of key in kvs.
func Lookup(kvs []KV, key string) (string, bool) {
	for _, kv := range kvs {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return "", false
}

// Service is the service port being evaluated.
type Service struct {
	Namespace, Name string
	PortName        string // empty for an unnamed port
	Protocol        string // TCP, UDP or SCTP
	Port            uint16
	// Labels and Annotations are only those under the configured prefix
	// (edgeproxy.io/ by default), sorted by key, prefix included.
	Labels, Annotations []KV
}

// Node is the node the proxy runs on.
type Node struct {
	Name, Zone, Region string
	Labels             []KV // the configured node labels, sorted by key
}

// Endpoint is one endpoint after built-in selection.
type Endpoint struct {
	Addr                        netip.Addr
	Port                        uint16
	NodeName, Zone              string
	Ready, Serving, Terminating bool
	// Local is set when the endpoint runs on this node.
	Local bool
	// HintZones and HintNodes are the topology hints.
	HintZones, HintNodes []string
	// Weight is the weight the previous module of the chain gave it, or 1
	// for the first module. Endpoints an earlier module dropped are not
	// passed on.
	Weight uint32
}

// Input is what a module is called with: one service port.
type Input struct {
	Service   Service
	Node      Node
	Endpoints []Endpoint
}

// Output is a module's answer.
type Output struct {
	// Weights holds one weight per input endpoint, in input order;
	// 0 drops the endpoint, the maximum is MaxWeight.
	Weights []uint32
	// Scheduler optionally names the IPVS scheduler (see Schedulers) and
	// SchedulerFlags its flags; empty keeps the configured default.
	Scheduler      string
	SchedulerFlags []string
	// Reason is a short human-readable explanation for the explain view.
	Reason string
}

// Endpoint flag bits in the wire encoding.
const (
	FlagReady       = 1 << 0
	FlagServing     = 1 << 1
	FlagTerminating = 1 << 2
	FlagLocal       = 1 << 3
)

// ErrTruncated is returned when an encoding ends early.
var ErrTruncated = errors.New("abi: truncated")

// AppendInput appends the encoding of in to b. Strings longer than 65535
// bytes and lists longer than 65535 items are cut (the agent never produces
// them: Kubernetes limits names, labels and hints far below).
func AppendInput(b []byte, in *Input) []byte {
	b = binary.LittleEndian.AppendUint32(b, Version)
	s := &in.Service
	b = appendStr(b, s.Namespace)
	b = appendStr(b, s.Name)
	b = appendStr(b, s.PortName)
	b = appendStr(b, s.Protocol)
	b = binary.LittleEndian.AppendUint16(b, s.Port)
	b = appendKVs(b, s.Labels)
	b = appendKVs(b, s.Annotations)
	n := &in.Node
	b = appendStr(b, n.Name)
	b = appendStr(b, n.Zone)
	b = appendStr(b, n.Region)
	b = appendKVs(b, n.Labels)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(in.Endpoints)))
	for i := range in.Endpoints {
		e := &in.Endpoints[i]
		var f byte
		if e.Ready {
			f |= FlagReady
		}
		if e.Serving {
			f |= FlagServing
		}
		if e.Terminating {
			f |= FlagTerminating
		}
		if e.Local {
			f |= FlagLocal
		}
		b = append(b, f)
		switch {
		case e.Addr.Is4():
			a := e.Addr.As4()
			b = append(b, 4)
			b = append(b, a[:]...)
		case e.Addr.IsValid():
			a := e.Addr.As16()
			b = append(b, 16)
			b = append(b, a[:]...)
		default:
			b = append(b, 0)
		}
		b = binary.LittleEndian.AppendUint16(b, e.Port)
		b = binary.LittleEndian.AppendUint32(b, e.Weight)
		b = appendStr(b, e.NodeName)
		b = appendStr(b, e.Zone)
		b = appendStrs(b, e.HintZones)
		b = appendStrs(b, e.HintNodes)
	}
	return b
}

// DecodeInput decodes an Input encoded by AppendInput.
func DecodeInput(b []byte, in *Input) error {
	return decodeInput(&reader{b: b}, in)
}

func decodeInput(r *reader, in *Input) error {
	b := r.b
	if v := r.u32(); r.err == nil && v != Version {
		return errors.New("abi: input version " + u32s(v) + ", want " + itoa(Version))
	}
	s := &in.Service
	s.Namespace = r.str()
	s.Name = r.str()
	s.PortName = r.str()
	s.Protocol = r.str()
	s.Port = r.u16()
	s.Labels = r.kvs(s.Labels[:0])
	s.Annotations = r.kvs(s.Annotations[:0])
	n := &in.Node
	n.Name = r.str()
	n.Zone = r.str()
	n.Region = r.str()
	n.Labels = r.kvs(n.Labels[:0])
	cnt := int(r.u32())
	if r.err != nil {
		return r.err
	}
	if cnt > len(b)/10 { // an endpoint takes at least 10 bytes
		return truncated("abi: " + itoa(cnt) + " endpoints do not fit in " + itoa(len(b)) + " bytes")
	}
	in.Endpoints = slices.Grow(in.Endpoints[:0], cnt)[:cnt]
	for i := range in.Endpoints {
		// The fixed part is read in place: calls are expensive in a wasm
		// guest, and this loop is most of the decoding.
		e := &in.Endpoints[i]
		if len(b)-r.off < 2 {
			return ErrTruncated
		}
		f, al := b[r.off], int(b[r.off+1])
		if al != 0 && al != 4 && al != 16 {
			return errors.New("abi: endpoint " + itoa(i) + ": address length " + itoa(al))
		}
		p := r.off + 2
		if len(b)-p < al+6 {
			return ErrTruncated
		}
		e.Ready = f&FlagReady != 0
		e.Serving = f&FlagServing != 0
		e.Terminating = f&FlagTerminating != 0
		e.Local = f&FlagLocal != 0
		switch al {
		case 4:
			e.Addr = netip.AddrFrom4([4]byte(b[p : p+4]))
		case 16:
			e.Addr = netip.AddrFrom16([16]byte(b[p : p+16]))
		default:
			e.Addr = netip.Addr{}
		}
		p += al
		e.Port = binary.LittleEndian.Uint16(b[p:])
		e.Weight = binary.LittleEndian.Uint32(b[p+2:])
		r.off = p + 6
		e.NodeName = r.str()
		e.Zone = r.str()
		e.HintZones = r.strs(e.HintZones[:0])
		e.HintNodes = r.strs(e.HintNodes[:0])
		if r.err != nil {
			return r.err
		}
	}
	return r.end()
}

// AppendOutput appends the encoding of out to b.
func AppendOutput(b []byte, out *Output) []byte {
	b = binary.LittleEndian.AppendUint32(b, Version)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(out.Weights)))
	for _, w := range out.Weights {
		b = binary.LittleEndian.AppendUint32(b, w)
	}
	b = appendStr(b, out.Scheduler)
	b = appendStrs(b, out.SchedulerFlags)
	b = appendStr(b, out.Reason)
	return b
}

// DecodeOutput decodes an Output encoded by AppendOutput. It checks the
// encoding only; Validate checks the values.
func DecodeOutput(b []byte, out *Output) error {
	r := reader{b: b}
	if v := r.u32(); r.err == nil && v != Version {
		return errors.New("abi: output version " + u32s(v) + ", want " + itoa(Version))
	}
	n := int(r.u32())
	if r.err != nil {
		return r.err
	}
	if n > (len(b)-8)/4 {
		return truncated("abi: " + itoa(n) + " weights do not fit in " + itoa(len(b)) + " bytes")
	}
	out.Weights = slices.Grow(out.Weights[:0], n)[:n]
	for i := range out.Weights {
		out.Weights[i] = r.u32()
	}
	out.Scheduler = r.str()
	out.SchedulerFlags = r.strs(out.SchedulerFlags[:0])
	out.Reason = r.str()
	if r.err != nil {
		return r.err
	}
	return r.end()
}

// Validate checks an output against the input it answers: one weight per
// input endpoint, each at most MaxWeight, a known scheduler with flags it
// accepts, a short UTF-8 reason. It does not reject an all-zero output;
// whether a module may empty a service is the chain's decision.
func (out *Output) Validate(endpoints int) error {
	if len(out.Weights) != endpoints {
		return errors.New("abi: " + itoa(len(out.Weights)) + " weights for " + itoa(endpoints) + " endpoints")
	}
	for i, w := range out.Weights {
		if w > MaxWeight {
			return errors.New("abi: weight " + u32s(w) + " of endpoint " + itoa(i) + " is above the maximum " + itoa(MaxWeight))
		}
	}
	if out.Scheduler != "" {
		allowed, ok := Schedulers[out.Scheduler]
		if !ok {
			return errors.New("abi: unknown scheduler " + quote32(out.Scheduler))
		}
		if len(out.SchedulerFlags) > MaxFlags {
			return errors.New("abi: " + itoa(len(out.SchedulerFlags)) + " scheduler flags, at most " + itoa(MaxFlags))
		}
		for i, f := range out.SchedulerFlags {
			if !slices.Contains(allowed, f) {
				return errors.New("abi: scheduler " + out.Scheduler + " does not take flag " + quote32(f))
			}
			if slices.Contains(out.SchedulerFlags[:i], f) {
				return errors.New("abi: scheduler flag " + f + " repeated")
			}
		}
	} else if len(out.SchedulerFlags) > 0 {
		return errors.New("abi: scheduler flags without a scheduler")
	}
	if len(out.Reason) > MaxReasonLen {
		return errors.New("abi: reason of " + itoa(len(out.Reason)) + " bytes, at most " + itoa(MaxReasonLen))
	}
	if !utf8.ValidString(out.Reason) {
		return errors.New("abi: reason is not UTF-8")
	}
	return nil
}

// AllZero reports whether out drops every endpoint (and there was one).
func (out *Output) AllZero() bool {
	for _, w := range out.Weights {
		if w != 0 {
			return false
		}
	}
	return len(out.Weights) > 0
}

func appendStr(b []byte, s string) []byte {
	if len(s) > 0xffff {
		s = s[:0xffff]
	}
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

func appendStrs(b []byte, ss []string) []byte {
	if len(ss) > 0xffff {
		ss = ss[:0xffff]
	}
	b = binary.LittleEndian.AppendUint16(b, uint16(len(ss)))
	for _, s := range ss {
		b = appendStr(b, s)
	}
	return b
}

func appendKVs(b []byte, kvs []KV) []byte {
	if len(kvs) > 0xffff {
		kvs = kvs[:0xffff]
	}
	b = binary.LittleEndian.AppendUint16(b, uint16(len(kvs)))
	for _, kv := range kvs {
		b = appendStr(b, kv.Key)
		b = appendStr(b, kv.Value)
	}
	return b
}

// reader decodes little-endian values; the first error sticks and later
// reads return zero values.
type reader struct {
	b   []byte
	off int
	err error
	// alias: strings point into b instead of being copied; b must then
	// never change (Decoder gives it a private copy).
	alias bool
}

func (r *reader) bytes(n int) []byte {
	if r.err != nil || n > len(r.b)-r.off {
		if r.err == nil {
			r.err = ErrTruncated
		}
		return make([]byte, n)
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	return p
}

func (r *reader) u8() byte {
	if r.err != nil || r.off >= len(r.b) {
		if r.err == nil {
			r.err = ErrTruncated
		}
		return 0
	}
	r.off++
	return r.b[r.off-1]
}

func (r *reader) u16() uint16 {
	if r.err != nil || len(r.b)-r.off < 2 {
		if r.err == nil {
			r.err = ErrTruncated
		}
		return 0
	}
	v := binary.LittleEndian.Uint16(r.b[r.off:])
	r.off += 2
	return v
}

func (r *reader) u32() uint32 {
	if r.err != nil || len(r.b)-r.off < 4 {
		if r.err == nil {
			r.err = ErrTruncated
		}
		return 0
	}
	v := binary.LittleEndian.Uint32(r.b[r.off:])
	r.off += 4
	return v
}

func (r *reader) str() string {
	n := int(r.u16())
	if r.err != nil || n == 0 {
		return ""
	}
	if n > len(r.b)-r.off {
		r.err = ErrTruncated
		return ""
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	if r.alias {
		return unsafe.String(&p[0], n)
	}
	return string(p)
}

func (r *reader) strs(dst []string) []string {
	if r.err == nil && len(r.b)-r.off >= 2 && r.b[r.off] == 0 && r.b[r.off+1] == 0 {
		r.off += 2
		return nil
	}
	n := int(r.u16())
	if r.err != nil || n > len(r.b)-r.off {
		if r.err == nil {
			r.err = ErrTruncated
		}
		return dst
	}
	for range n {
		dst = append(dst, r.str())
	}
	if n == 0 {
		return nil
	}
	return dst
}

func (r *reader) kvs(dst []KV) []KV {
	n := int(r.u16())
	if r.err != nil || n > len(r.b)-r.off {
		if r.err == nil {
			r.err = ErrTruncated
		}
		return dst
	}
	for range n {
		k := r.str()
		dst = append(dst, KV{k, r.str()})
	}
	if n == 0 {
		return nil
	}
	return dst
}

func (r *reader) end() error {
	if r.err != nil {
		return r.err
	}
	if r.off != len(r.b) {
		return errors.New("abi: " + itoa(len(r.b)-r.off) + " trailing bytes")
	}
	return nil
}
