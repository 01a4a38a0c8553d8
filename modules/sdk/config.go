package sdk

import (
	"errors"
	"strconv"
	"unicode/utf8"
)

// Value is a JSON value, as ParseConfig reads a module's config. The SDK
// reads configs itself rather than with encoding/json: that package (and
// the reflection it needs) nearly doubles a module's code, and the host
// validates all of it at every load and runs its package inits at every
// instantiation (modules/README.md, "Cost per call").
type Value struct {
	Kind Kind
	// Text is a String's value, a Number's text as written, or "true" or
	// "false".
	Text string
	// Items are an Array's elements, or an Object's values in the order
	// written.
	Items []Value
	// Keys are an Object's keys, one per item.
	Keys []string
}

// Kind is the type of a Value.
type Kind uint8

// Kinds of Value.
const (
	Null Kind = iota
	Bool
	Number
	String
	Array
	Object
)

// Field returns the value of an object's field whose key equals name
// ignoring ASCII case — the last such key, the way encoding/json fills a
// struct field — and false when there is none, when it is null, or when v
// is not an object.
func (v Value) Field(name string) (Value, bool) {
	if v.Kind != Object {
		return Value{}, false
	}
	for k := len(v.Keys) - 1; k >= 0; k-- {
		if equalFold(v.Keys[k], name) {
			return v.Items[k], v.Items[k].Kind != Null
		}
	}
	return Value{}, false
}

// Int returns a Number written as an integer (no fraction or exponent)
// that fits an int64.
func (v Value) Int() (int64, bool) {
	if v.Kind != Number {
		return 0, false
	}
	n, err := strconv.ParseInt(v.Text, 10, 64)
	return n, err == nil
}

// Str returns a String's value.
func (v Value) Str() (string, bool) { return v.Text, v.Kind == String }

func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range len(a) {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// ParseConfig reads one JSON value (a module's config); nothing but
// white space may follow it. Strings are unescaped, invalid UTF-8 and
// lone surrogates become U+FFFD as with encoding/json, and nesting is
// limited to 64 levels.
func ParseConfig(b []byte) (Value, error) {
	p := jsonParser{b: b}
	v, err := p.value()
	if err != nil {
		return Value{}, err
	}
	if p.ws(); p.p != len(b) {
		return Value{}, errors.New("json: trailing data")
	}
	return v, nil
}

type jsonParser struct {
	b     []byte
	p     int
	depth int
}

func (p *jsonParser) ws() {
	for p.p < len(p.b) && (p.b[p.p] == ' ' || p.b[p.p] == '\t' || p.b[p.p] == '\n' || p.b[p.p] == '\r') {
		p.p++
	}
}

// peek returns the next byte, or 0 at the end.
func (p *jsonParser) peek() byte {
	if p.p < len(p.b) {
		return p.b[p.p]
	}
	return 0
}

func (p *jsonParser) value() (Value, error) {
	p.ws()
	switch c := p.peek(); {
	case c == '{' || c == '[':
		if p.depth++; p.depth > 64 {
			return Value{}, errors.New("json: nested too deep")
		}
		defer func() { p.depth-- }()
		if c == '{' {
			return p.object()
		}
		return p.array()
	case c == '"':
		s, err := p.string()
		return Value{Kind: String, Text: s}, err
	case c == 't':
		return p.literal("true", Value{Kind: Bool, Text: "true"})
	case c == 'f':
		return p.literal("false", Value{Kind: Bool, Text: "false"})
	case c == 'n':
		return p.literal("null", Value{})
	case c == '-' || ('0' <= c && c <= '9'):
		return p.number()
	}
	return Value{}, errors.New("json: unexpected input")
}

func (p *jsonParser) literal(s string, v Value) (Value, error) {
	if len(p.b)-p.p < len(s) || string(p.b[p.p:p.p+len(s)]) != s {
		return Value{}, errors.New("json: invalid literal")
	}
	p.p += len(s)
	return v, nil
}

func (p *jsonParser) object() (Value, error) {
	v := Value{Kind: Object}
	if p.open('}') {
		return v, nil
	}
	for {
		if p.ws(); p.peek() != '"' {
			return Value{}, errors.New("json: object key is not a string")
		}
		k, err := p.string()
		if err != nil {
			return Value{}, err
		}
		if p.ws(); p.peek() != ':' {
			return Value{}, errors.New("json: missing ':'")
		}
		p.p++
		item, err := p.value()
		if err != nil {
			return Value{}, err
		}
		v.Keys, v.Items = append(v.Keys, k), append(v.Items, item)
		if more, err := p.next('}'); !more {
			return v, err
		}
	}
}

func (p *jsonParser) array() (Value, error) {
	v := Value{Kind: Array}
	if p.open(']') {
		return v, nil
	}
	for {
		item, err := p.value()
		if err != nil {
			return Value{}, err
		}
		v.Items = append(v.Items, item)
		if more, err := p.next(']'); !more {
			return v, err
		}
	}
}

// open consumes the opening byte of an object or array and reports
// whether its closing byte follows at once.
func (p *jsonParser) open(closing byte) bool {
	p.p++
	if p.ws(); p.peek() == closing {
		p.p++
		return true
	}
	return false
}

// next reads what follows an item of an object or array: a comma (more
// items follow) or its closing byte.
func (p *jsonParser) next(closing byte) (more bool, err error) {
	p.ws()
	switch p.peek() {
	case ',':
		p.p++
		return true, nil
	case closing:
		p.p++
		return false, nil
	}
	return false, errors.New("json: missing ',' or '" + string(rune(closing)) + "'")
}

func (p *jsonParser) digits() int {
	start := p.p
	for c := p.peek(); '0' <= c && c <= '9'; c = p.peek() {
		p.p++
	}
	return p.p - start
}

func (p *jsonParser) number() (Value, error) {
	start := p.p
	if p.peek() == '-' {
		p.p++
	}
	first := p.peek()
	if n := p.digits(); n == 0 || (first == '0' && n > 1) {
		return Value{}, errors.New("json: invalid number")
	}
	if p.peek() == '.' {
		p.p++
		if p.digits() == 0 {
			return Value{}, errors.New("json: invalid number")
		}
	}
	if c := p.peek(); c == 'e' || c == 'E' {
		p.p++
		if c := p.peek(); c == '+' || c == '-' {
			p.p++
		}
		if p.digits() == 0 {
			return Value{}, errors.New("json: invalid number")
		}
	}
	return Value{Kind: Number, Text: string(p.b[start:p.p])}, nil
}

// hex4 reads the four hex digits of a \u escape.
func (p *jsonParser) hex4() (rune, error) {
	if len(p.b)-p.p < 4 {
		return 0, errors.New("json: short \\u escape")
	}
	n, err := strconv.ParseUint(string(p.b[p.p:p.p+4]), 16, 32)
	if err != nil {
		return 0, errors.New("json: bad \\u escape")
	}
	p.p += 4
	return rune(n), nil
}

var escapes = [...]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

func (p *jsonParser) string() (string, error) {
	p.p++
	var out []byte
	for {
		if p.p >= len(p.b) {
			return "", errors.New("json: unterminated string")
		}
		c := p.b[p.p]
		p.p++
		switch {
		case c == '"':
			return string(out), nil
		case c < 0x20:
			return "", errors.New("json: control character in string")
		case c == '\\':
			e := p.peek()
			p.p++
			if e == 'u' {
				r, err := p.escapedRune()
				if err != nil {
					return "", err
				}
				out = utf8.AppendRune(out, r)
				continue
			}
			if int(e) >= len(escapes) || escapes[e] == 0 {
				return "", errors.New("json: bad escape")
			}
			out = append(out, escapes[e])
		case c < utf8.RuneSelf:
			out = append(out, c)
		default:
			r, n := utf8.DecodeRune(p.b[p.p-1:])
			p.p += n - 1
			out = utf8.AppendRune(out, r) // invalid UTF-8 becomes U+FFFD
		}
	}
}

// escapedRune reads what follows \u: a rune, joining a surrogate pair.
func (p *jsonParser) escapedRune() (rune, error) {
	r, err := p.hex4()
	if err != nil || r < 0xd800 || r >= 0xe000 {
		return r, err
	}
	if r < 0xdc00 && len(p.b)-p.p >= 6 && p.b[p.p] == '\\' && p.b[p.p+1] == 'u' {
		save := p.p
		p.p += 2
		lo, err := p.hex4()
		if err == nil && lo >= 0xdc00 && lo < 0xe000 {
			return 0x10000 + (r-0xd800)<<10 + (lo - 0xdc00), nil
		}
		p.p = save
	}
	return utf8.RuneError, nil
}
