package policy

import (
	"errors"
	"fmt"
	"strings"
)

// interruptExport names the global that instrument adds to a module: an
// i32, 0 while the module may run; the host's deadline timer sets it to 1
// (watchdog). The module's own code cannot name it (it is appended after
// every global the code was written against, and a wasm module cannot
// read its own exports); only the checks instrument inserts read it. The
// countdown global after it is not exported.
const interruptExport = "edgeproxy.interrupt"

// instrument returns a copy of the module wasm with a check (checkCode)
// at the start of every function and the head of every loop: every
// checkPeriod checks it leaves the machine code for Go and traps
// (unreachable) when the interrupt global is set. A guest that runs long
// loops or calls, so setting the global stops it within checkPeriod
// iterations or calls; the usual path of the check is a load, a branch
// and a decrement in the compiled code instead of the call into Go that
// wazero inserts with WithCloseOnContextDone (RATIONALE.md, "The
// interrupt check"). A module without a memory of its own is refused: the
// slow path grows memory by 0 pages.
//
// It reads every instruction as wazero's validator does (the opcodes of
// WebAssembly 2.0, which the host enables: MVP, sign extension,
// saturating truncation, bulk memory, reference types, multi-value,
// SIMD) and returns an error for anything else; the caller then runs the
// module unmodified under wazero's own checks. Whatever instrument
// returns is compiled, and so validated, by wazero like any module.
// DWARF sections (.debug_*) are dropped: their code offsets no longer
// hold. The name section is kept: function indices do not change.
func instrument(wasm []byte) ([]byte, error) {
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" || string(wasm[4:8]) != "\x01\x00\x00\x00" {
		return nil, errors.New("not a WebAssembly 1.0 binary")
	}
	secs, err := splitSections(wasm[8:])
	if err != nil {
		return nil, err
	}
	var imported, defined uint32
	memory := false
	for _, s := range secs {
		switch s.id {
		case secMemory:
			p := &parser{b: s.body}
			memory = p.u32() > 0 && p.err == nil
		case secImport:
			if imported, err = countImportedGlobals(s.body); err != nil {
				return nil, fmt.Errorf("import section: %w", err)
			}
		case secGlobal:
			p := &parser{b: s.body}
			if defined = p.u32(); p.err != nil {
				return nil, fmt.Errorf("global section: %w", p.err)
			}
		case secExport:
			if err := checkExportFree(s.body, interruptExport); err != nil {
				return nil, err
			}
		}
	}
	if !memory {
		return nil, errors.New("no memory of its own, for the check's memory.grow")
	}
	global := imported + defined
	check := checkCode(global)
	out := make([]byte, 0, len(wasm)+len(wasm)/8)
	out = append(out, wasm[:8]...)
	haveGlobal, haveExport := false, false
	for _, s := range secs {
		if s.id != secCustom {
			if !haveGlobal && sectionRank(s.id) > sectionRank(secGlobal) {
				out, haveGlobal = appendSection(out, secGlobal, appendInterruptGlobals(appendU32(nil, 2))), true
			}
			if !haveExport && sectionRank(s.id) > sectionRank(secExport) {
				out, haveExport = appendSection(out, secExport, appendInterruptExport(appendU32(nil, 1), global)), true
			}
		}
		switch s.id {
		case secCustom:
			if p := (&parser{b: s.body}); strings.HasPrefix(p.name(), ".debug") && p.err == nil {
				continue
			}
			out = appendSection(out, s.id, s.body)
		case secGlobal:
			out, haveGlobal = appendSection(out, s.id, appendInterruptGlobals(bumpCount(s.body, 2))), true
		case secExport:
			out, haveExport = appendSection(out, s.id, appendInterruptExport(bumpCount(s.body, 1), global)), true
		case secCode:
			body, err := instrumentCode(s.body, check)
			if err != nil {
				return nil, fmt.Errorf("code section: %w", err)
			}
			out = appendSection(out, s.id, body)
		default:
			out = appendSection(out, s.id, s.body)
		}
	}
	if !haveGlobal {
		out = appendSection(out, secGlobal, appendInterruptGlobals(appendU32(nil, 2)))
	}
	if !haveExport {
		out = appendSection(out, secExport, appendInterruptExport(appendU32(nil, 1), global))
	}
	return out, nil
}

// Section ids.
const (
	secCustom = 0
	secImport = 2
	secMemory = 5
	secGlobal = 6
	secExport = 7
	secCode   = 10
)

type section struct {
	id   byte
	body []byte
}

func splitSections(b []byte) ([]section, error) {
	p := &parser{b: b}
	var secs []section
	for p.off < len(p.b) {
		id := p.byte()
		size := int(p.u32())
		if p.err != nil {
			return nil, p.err
		}
		if size > len(p.b)-p.off {
			return nil, fmt.Errorf("section %d: size %d past the end", id, size)
		}
		secs = append(secs, section{id, p.b[p.off : p.off+size]})
		p.off += size
	}
	return secs, nil
}

// sectionRank is a non-custom section's place in the order the binary
// format requires (the tag section, 13, sits between memory and global,
// data count, 12, before code).
func sectionRank(id byte) int {
	switch id {
	case 13:
		return 6
	case 6, 7, 8, 9:
		return int(id) + 1
	case 12:
		return 11
	case 10, 11:
		return int(id) + 2
	}
	return int(id)
}

func appendSection(out []byte, id byte, body []byte) []byte {
	out = append(out, id)
	out = appendU32(out, uint32(len(body)))
	return append(out, body...)
}

// bumpCount returns a vector's encoding with its count by more.
func bumpCount(body []byte, by uint32) []byte {
	p := &parser{b: body}
	n := p.u32() // read without error by the first pass
	out := appendU32(make([]byte, 0, len(body)+32), n+by)
	return append(out, body[p.off:]...)
}

// appendInterruptGlobals appends the two globals of the check: the
// interrupt flag, (mut i32) = 0, and the countdown to the next slow path,
// (mut i32) = checkPeriod.
func appendInterruptGlobals(b []byte) []byte {
	b = append(b, 0x7f, 0x01, 0x41, 0x00, 0x0b)
	return append(appendS32(append(b, 0x7f, 0x01, 0x41), checkPeriod), 0x0b)
}

// checkPeriod is how many checks pass between two slow paths: a slow
// path reads the interrupt flag and leaves the machine code for Go, so
// the guest stops within checkPeriod checks of the timer firing, and the
// Go scheduler can stop the goroutine (a garbage collection's
// stop-the-world waits for every running goroutine; compiled wasm code
// without exits to Go would make it wait until the call ends, and the
// timer, which cannot run during it, would never end a spinning one).
const checkPeriod = 1000

// checkCode is the check inserted at every function start and loop head;
// flag is the interrupt global's index, flag+1 the countdown's:
//
//	global.get count; i32.eqz
//	if
//	  i32.const 0; memory.grow; drop   ;; leaves the machine code for Go
//	  global.get flag; if unreachable end
//	  i32.const checkPeriod; global.set count
//	end
//	global.get count; i32.const 1; i32.sub; global.set count
//
// The usual path is a load, a compare, a branch and a decrement.
// memory.grow by 0 pages changes nothing; wazero runs every memory.grow
// in Go.
func checkCode(flag uint32) []byte {
	count := flag + 1
	b := appendU32([]byte{0x23}, count)
	b = append(b, 0x45, 0x04, 0x40, 0x41, 0x00, 0x40, 0x00, 0x1a, 0x23)
	b = appendU32(b, flag)
	b = append(b, 0x04, 0x40, 0x00, 0x0b, 0x41)
	b = appendS32(b, checkPeriod)
	b = appendU32(append(b, 0x24), count)
	b = appendU32(append(b, 0x0b, 0x23), count)
	b = append(b, 0x41, 0x01, 0x6b, 0x24)
	return appendU32(b, count)
}

// appendS32 appends v as a signed LEB128.
func appendS32(b []byte, v int32) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

func appendInterruptExport(b []byte, global uint32) []byte {
	b = appendU32(b, uint32(len(interruptExport)))
	b = append(b, interruptExport...)
	return appendU32(append(b, 0x03), global)
}

func countImportedGlobals(body []byte) (uint32, error) {
	imports, err := parseImportEntries(&parser{b: body})
	var n uint32
	for _, im := range imports {
		if im.Kind == 3 {
			n++
		}
	}
	return n, err
}

func checkExportFree(body []byte, name string) error {
	p := &parser{b: body}
	n := p.u32()
	for i := uint32(0); i < n && p.err == nil; i++ {
		if p.name() == name {
			return fmt.Errorf("the module exports %q itself", name)
		}
		p.byte()
		p.u32()
	}
	if p.err != nil {
		return fmt.Errorf("export section: %w", p.err)
	}
	return nil
}

// instrumentCode rewrites the code section: each function body with check
// inserted at its start and after the block type of each loop.
func instrumentCode(body []byte, check []byte) ([]byte, error) {
	p := &parser{b: body}
	n := p.u32()
	out := appendU32(make([]byte, 0, len(body)+len(body)/8), n)
	var heads []int
	for f := uint32(0); f < n; f++ {
		size := int(p.u32())
		if p.err != nil || size > len(p.b)-p.off {
			return nil, fmt.Errorf("function %d: size past the end", f)
		}
		fn := p.b[p.off : p.off+size]
		p.off += size
		var err error
		if heads, err = loopHeads(fn, heads[:0]); err != nil {
			return nil, fmt.Errorf("function %d: %w", f, err)
		}
		out = appendU32(out, uint32(size+len(heads)*len(check)))
		last := 0
		for _, h := range heads {
			out = append(append(out, fn[last:h]...), check...)
			last = h
		}
		out = append(out, fn[last:]...)
	}
	if p.err != nil {
		return nil, p.err
	}
	if p.off != len(p.b) {
		return nil, errors.New("bytes after the last function")
	}
	return out, nil
}

// loopHeads appends to heads the offsets in fn (one function body:
// locals, then code) where a check goes: the start of the code, and just
// after each loop's block type. Code with neither loops nor calls runs
// once through; so every long run meets a check, recursion with no loop
// (a call tree of exponential size) included.
func loopHeads(fn []byte, heads []int) ([]int, error) {
	p := &parser{b: fn}
	for n := p.u32(); n > 0 && p.err == nil; n-- {
		p.u32()  // count
		p.byte() // type
	}
	heads = append(heads, p.off)
	for p.off < len(p.b) && p.err == nil {
		op := p.byte()
		if op == 0x03 { // loop
			p.blockType()
			heads = append(heads, p.off)
			continue
		}
		if err := p.skipImmediates(op); err != nil {
			return nil, err
		}
	}
	return heads, p.err
}

// skipImmediates reads the immediates of the instruction op.
func (p *parser) skipImmediates(op byte) error {
	switch {
	case op <= 0x01, op == 0x05, op == 0x0b, op == 0x0f, op == 0x1a, op == 0x1b, op == 0xd1,
		op >= 0x45 && op <= 0xc4: // control without immediates, drop, select, numeric
	case op == 0x02, op == 0x04: // block, if
		p.blockType()
	case op == 0x0c, op == 0x0d, op == 0x10, op >= 0x20 && op <= 0x26, op == 0xd2, op == 0x3f, op == 0x40:
		p.u32() // label, function, local, global, table, memory or function index
	case op == 0x0e: // br_table
		n := p.u32()
		if int(n) > len(p.b)-p.off {
			return errShort
		}
		for ; n > 0; n-- {
			p.u32()
		}
		p.u32()
	case op == 0x11: // call_indirect: type, table
		p.u32()
		p.u32()
	case op == 0x1c: // select with types
		n := p.u32()
		if int(n) > len(p.b)-p.off {
			return errShort
		}
		p.off += int(n)
	case op >= 0x28 && op <= 0x3e:
		p.memarg()
	case op == 0x41:
		p.leb(5)
	case op == 0x42:
		p.leb(10)
	case op == 0x43:
		p.skip(4)
	case op == 0x44:
		p.skip(8)
	case op == 0xd0: // ref.null
		p.byte()
	case op == 0xfc:
		return p.skipMisc()
	case op == 0xfd:
		return p.skipSIMD()
	default:
		return fmt.Errorf("opcode %#x at %d is not rewritten", op, p.off-1)
	}
	return nil
}

func (p *parser) skipMisc() error {
	switch op := p.u32(); {
	case op <= 7: // saturating truncation
	case op == 8, op == 12, op == 10, op == 14: // memory.init, table.init, memory.copy, table.copy
		p.u32()
		p.u32()
	case op <= 17: // data.drop, memory.fill, elem.drop, table.grow, size, fill
		p.u32()
	default:
		return fmt.Errorf("opcode 0xfc %d is not rewritten", op)
	}
	return nil
}

func (p *parser) skipSIMD() error {
	switch op := p.u32(); {
	case op <= 11, op == 92, op == 93: // loads and stores
		p.memarg()
	case op == 12, op == 13: // v128.const, i8x16.shuffle
		p.skip(16)
	case op >= 21 && op <= 34: // extract and replace lane
		p.byte()
	case op >= 84 && op <= 91: // load and store lane
		p.memarg()
		p.byte()
	case op <= 255:
	default:
		return fmt.Errorf("opcode 0xfd %d is not rewritten", op)
	}
	return nil
}

// blockType reads a block type as wazero does: a signed 33-bit LEB128
// (0x40 empty, a value type, or a type index), a reference type's heap
// type after it.
func (p *parser) blockType() {
	v := p.leb(5)
	if v == 0x63 || v == 0x64 { // (ref null ht), (ref ht)
		p.leb(5)
	}
}

func (p *parser) memarg() {
	p.u32() // alignment
	p.u32() // offset
}

// leb skips a LEB128 of at most max bytes and returns its first byte.
func (p *parser) leb(max int) byte {
	first := byte(0)
	for i := 0; i < max; i++ {
		c := p.byte()
		if i == 0 {
			first = c
		}
		if c&0x80 == 0 || p.err != nil {
			return first
		}
	}
	p.err = errors.New("LEB128 too long")
	return 0
}

func (p *parser) skip(n int) {
	if p.err == nil && n > len(p.b)-p.off {
		p.err = errShort
	}
	if p.err == nil {
		p.off += n
	}
}

func appendU32(b []byte, v uint32) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}
