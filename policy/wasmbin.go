package policy

import (
	"bytes"
	"errors"
	"fmt"
)

// wasmImport is one entry of a module's import section.
type wasmImport struct {
	Module, Name string
	Kind         byte // 0 func, 1 table, 2 memory, 3 global, 4 tag
}

var importKinds = [...]string{"function", "table", "memory", "global", "tag"}

func (i wasmImport) kind() string {
	if int(i.Kind) < len(importKinds) {
		return importKinds[i.Kind]
	}
	return fmt.Sprintf("kind %d", i.Kind)
}

// parseImports reads the import section of a WebAssembly binary without
// compiling it: wazero's CompiledModule lists imported functions and
// memories but not tables or globals, and the checks must refuse those too.
func parseImports(b []byte) ([]wasmImport, error) {
	if len(b) < 8 || !bytes.Equal(b[:4], []byte("\x00asm")) {
		return nil, errors.New("not a WebAssembly binary (bad magic)")
	}
	if !bytes.Equal(b[4:8], []byte{1, 0, 0, 0}) {
		return nil, fmt.Errorf("unsupported binary version % x", b[4:8])
	}
	secs, err := splitSections(b[8:])
	if err != nil {
		return nil, err
	}
	for _, s := range secs {
		if s.id == secImport {
			out, err := parseImportEntries(&parser{b: s.body})
			if err != nil {
				return nil, fmt.Errorf("import section: %w", err)
			}
			return out, nil
		}
	}
	return nil, nil
}

// parseImportEntries reads the entries of an import section from p.
func parseImportEntries(sec *parser) ([]wasmImport, error) {
	n := int(sec.u32())
	var out []wasmImport
	for i := 0; i < n && sec.err == nil; i++ {
		im := wasmImport{Module: sec.name(), Name: sec.name(), Kind: sec.byte()}
		switch im.Kind {
		case 0: // type index
			sec.u32()
		case 1: // reftype + limits
			sec.byte()
			sec.limits()
		case 2:
			sec.limits()
		case 3: // valtype + mutability
			sec.byte()
			sec.byte()
		case 4: // attribute + type index
			sec.byte()
			sec.u32()
		default:
			return nil, fmt.Errorf("import %d: unknown kind %d", i, im.Kind)
		}
		out = append(out, im)
	}
	return out, sec.err
}

type parser struct {
	b   []byte
	off int
	err error
}

var errShort = errors.New("unexpected end")

func (p *parser) byte() byte {
	if p.err != nil || p.off >= len(p.b) {
		p.err = errShort
		return 0
	}
	p.off++
	return p.b[p.off-1]
}

// u32 reads an unsigned LEB128 of at most 5 bytes.
func (p *parser) u32() uint32 {
	var v uint32
	for shift := 0; shift < 35; shift += 7 {
		c := p.byte()
		if p.err != nil {
			return 0
		}
		v |= uint32(c&0x7f) << shift
		if c&0x80 == 0 {
			return v
		}
	}
	p.err = errors.New("LEB128 too long")
	return 0
}

func (p *parser) name() string {
	n := int(p.u32())
	if p.err != nil || n > len(p.b)-p.off {
		p.err = errShort
		return ""
	}
	s := string(p.b[p.off : p.off+n])
	p.off += n
	return s
}

func (p *parser) limits() {
	flags := p.byte()
	p.u32()
	if flags&1 != 0 {
		p.u32()
	}
}
