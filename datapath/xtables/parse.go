package xtables

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// ParseRule reads a rule as iptables-restore reads it after "-A CHAIN "
// (what Rule.Text writes) back into a Rule. It knows exactly the matches
// and targets the typed model has and refuses everything else, and text
// that Text would not have written (a comment before a match, a port
// without its protocol): ParseRule(r.Text()) gives r back.
func ParseRule(text string) (Rule, error) {
	toks, err := splitArgs(text)
	if err != nil {
		return Rule{}, err
	}
	p := ruleParser{toks: toks}
	r, err := p.rule()
	if err != nil {
		return Rule{}, fmt.Errorf("rule %q: %w", text, err)
	}
	if got := r.Text(); got != text {
		return Rule{}, fmt.Errorf("rule %q: not as written (reads back as %q)", text, got)
	}
	return r, nil
}

// splitArgs splits restore text at spaces; a double-quoted word may hold
// spaces (no escapes: comments carry no quotes nor backslashes).
func splitArgs(s string) ([]string, error) {
	var out []string
	for s = strings.TrimLeft(s, " "); s != ""; s = strings.TrimLeft(s, " ") {
		if s[0] == '"' {
			end := strings.IndexByte(s[1:], '"')
			if end < 0 {
				return nil, errors.New("unterminated quote")
			}
			out = append(out, s[1:1+end])
			s = s[2+end:]
			continue
		}
		w, rest, _ := strings.Cut(s, " ")
		out = append(out, w)
		s = rest
	}
	return out, nil
}

type ruleParser struct {
	toks []string
	i    int
}

func (p *ruleParser) next() (string, error) {
	if p.i >= len(p.toks) {
		return "", errors.New("unexpected end")
	}
	p.i++
	return p.toks[p.i-1], nil
}

// want consumes the words ws, in order.
func (p *ruleParser) want(ws ...string) error {
	for _, w := range ws {
		got, err := p.next()
		if err != nil {
			return fmt.Errorf("want %q: %w", w, err)
		}
		if got != w {
			return fmt.Errorf("want %q, got %q", w, got)
		}
	}
	return nil
}

// not consumes a "!" if it comes next.
func (p *ruleParser) not() bool {
	if p.i < len(p.toks) && p.toks[p.i] == "!" {
		p.i++
		return true
	}
	return false
}

func (p *ruleParser) rule() (Rule, error) {
	var r Rule
	for {
		neg := p.not()
		w, err := p.next()
		if err != nil {
			return r, err
		}
		if neg && w != "-s" && w != "-d" && w != "-i" {
			return r, fmt.Errorf("\"!\" before %q", w)
		}
		switch w {
		case "-s", "-d":
			m, err := p.address(w == "-s", neg)
			if err != nil {
				return r, err
			}
			r.Matches = append(r.Matches, m)
		case "-i":
			name, err := p.next()
			if err != nil {
				return r, err
			}
			r.Matches = append(r.Matches, Match{kind: mInIface, name: name, not: neg})
		case "-p":
			m, err := p.proto()
			if err != nil {
				return r, err
			}
			r.Matches = append(r.Matches, m)
		case "-m":
			mod, err := p.next()
			if err != nil {
				return r, err
			}
			if mod == "comment" {
				if err := p.want("--comment"); err != nil {
					return r, err
				}
				if r.Comment, err = p.next(); err != nil {
					return r, err
				}
				continue
			}
			if r.Comment != "" {
				return r, fmt.Errorf("match %s after the comment", mod)
			}
			m, err := p.module(mod)
			if err != nil {
				return r, fmt.Errorf("-m %s: %w", mod, err)
			}
			r.Matches = append(r.Matches, m)
		case "-j":
			t, err := p.target()
			if err != nil {
				return r, err
			}
			if p.i != len(p.toks) {
				return r, fmt.Errorf("words after the target: %q", p.toks[p.i:])
			}
			r.Target = t
			return r, r.Validate()
		default:
			return r, fmt.Errorf("unknown option %q", w)
		}
	}
}

func (p *ruleParser) address(src, neg bool) (Match, error) {
	w, err := p.next()
	if err != nil {
		return Match{}, err
	}
	pf, err := netip.ParsePrefix(w)
	if err != nil {
		return Match{}, err
	}
	kind := mDst
	if src {
		kind = mSrc
	}
	return Match{kind: kind, prefix: pf, not: neg}, nil
}

func (p *ruleParser) proto() (Match, error) {
	proto, err := p.next()
	if err != nil {
		return Match{}, err
	}
	m := Proto(proto)
	if p.i+1 < len(p.toks) && p.toks[p.i] == "-m" && p.toks[p.i+1] == proto {
		if err := p.want("-m", proto, "--dport"); err != nil {
			return m, err
		}
		port, err := p.uint(16)
		if err != nil {
			return m, err
		}
		m.port = uint16(port)
	}
	return m, nil
}

func (p *ruleParser) uint(bits int) (uint64, error) {
	w, err := p.next()
	if err != nil {
		return 0, err
	}
	if strings.HasPrefix(w, "0x") {
		return strconv.ParseUint(w[2:], 16, bits)
	}
	return strconv.ParseUint(w, 10, bits)
}

// module parses the options of match module mod (after "-m mod").
func (p *ruleParser) module(mod string) (Match, error) {
	switch mod {
	case "addrtype":
		return p.addrType()
	case "conntrack":
		return p.conntrack()
	case "mark":
		return p.mark()
	case "statistic":
		return p.statistic()
	case "recent":
		return p.recent()
	case "set":
		return p.set()
	}
	return Match{}, errors.New("unknown match")
}

// addrType: --src-type LOCAL or --dst-type LOCAL.
func (p *ruleParser) addrType() (Match, error) {
	dir, err := p.next()
	if err != nil {
		return Match{}, err
	}
	if dir != "--src-type" && dir != "--dst-type" {
		return Match{}, fmt.Errorf("unknown option %q", dir)
	}
	return Match{kind: mAddrType, src: dir == "--src-type"}, p.want("LOCAL")
}

// conntrack: [!] --ctstate STATES, or --ctorigdst A --ctorigdstport P
// --ctproto PROTO.
func (p *ruleParser) conntrack() (Match, error) {
	neg := p.not()
	w, err := p.next()
	if err != nil {
		return Match{}, err
	}
	switch {
	case w == "--ctstate":
		states, err := p.next()
		return Match{kind: mCtState, name: states, not: neg}, err
	case w == "--ctorigdst" && !neg:
		return p.ctOrigDst()
	}
	return Match{}, fmt.Errorf("unknown option %q", w)
}

func (p *ruleParser) ctOrigDst() (Match, error) {
	a, err := p.next()
	if err != nil {
		return Match{}, err
	}
	addr, err := netip.ParseAddr(a)
	if err != nil {
		return Match{}, err
	}
	if err := p.want("--ctorigdstport"); err != nil {
		return Match{}, err
	}
	port, err := p.uint(16)
	if err != nil {
		return Match{}, err
	}
	if err := p.want("--ctproto"); err != nil {
		return Match{}, err
	}
	proto, err := p.next()
	return CtOrigDst(addr, uint16(port), proto), err
}

// mark: [!] --mark 0xM/0xM (one bit, as we write it).
func (p *ruleParser) mark() (Match, error) {
	neg := p.not()
	if err := p.want("--mark"); err != nil {
		return Match{}, err
	}
	w, err := p.next()
	if err != nil {
		return Match{}, err
	}
	v, mask, _ := strings.Cut(w, "/")
	if v != mask || !strings.HasPrefix(v, "0x") {
		return Match{}, fmt.Errorf("mark %q is not 0xM/0xM", w)
	}
	m, err := strconv.ParseUint(v[2:], 16, 32)
	return Match{kind: mMark, n: int64(m), not: neg}, err
}

// statistic: --mode random --probability P.
func (p *ruleParser) statistic() (Match, error) {
	if err := p.want("--mode", "random", "--probability"); err != nil {
		return Match{}, err
	}
	w, err := p.next()
	if err != nil {
		return Match{}, err
	}
	prob, err := strconv.ParseFloat(w, 64)
	return Probability(prob), err
}

// recent: --name L, then --rcheck --seconds S --reap or --set --rsource.
func (p *ruleParser) recent() (Match, error) {
	if err := p.want("--name"); err != nil {
		return Match{}, err
	}
	list, err := p.next()
	if err != nil {
		return Match{}, err
	}
	w, err := p.next()
	if err != nil {
		return Match{}, err
	}
	switch w {
	case "--rcheck":
		if err := p.want("--seconds"); err != nil {
			return Match{}, err
		}
		secs, err := p.uint(63)
		if err != nil {
			return Match{}, err
		}
		return RecentSeen(list, int64(secs)), p.want("--reap")
	case "--set":
		return RecentSet(list), p.want("--rsource")
	}
	return Match{}, fmt.Errorf("unknown option %q", w)
}

// set: [!] --match-set NAME DIRS.
func (p *ruleParser) set() (Match, error) {
	neg := p.not()
	if err := p.want("--match-set"); err != nil {
		return Match{}, err
	}
	set, err := p.next()
	if err != nil {
		return Match{}, err
	}
	dirs, err := p.next()
	return Match{kind: mSet, name: set, dirs: setDirs(dirs), not: neg}, err
}

func (p *ruleParser) target() (Target, error) {
	name, err := p.next()
	if err != nil {
		return Target{}, err
	}
	switch name {
	case "RETURN":
		return Return, nil
	case "ACCEPT":
		return Accept, nil
	case "DROP":
		return Drop, nil
	case "REJECT":
		return Reject, nil
	case "DNAT":
		if err := p.want("--to-destination"); err != nil {
			return Target{}, err
		}
		w, err := p.next()
		if err != nil {
			return Target{}, err
		}
		to, err := netip.ParseAddrPort(w)
		return DNAT(to), err
	case "MARK":
		op, err := p.next()
		if err != nil {
			return Target{}, err
		}
		m, err := p.uint(32)
		if err != nil {
			return Target{}, err
		}
		switch op {
		case "--or-mark":
			return MarkOr(uint32(m)), nil
		case "--xor-mark":
			return MarkXor(uint32(m)), nil
		}
		return Target{}, fmt.Errorf("MARK: unknown option %q", op)
	case "MASQUERADE":
		random := p.i < len(p.toks) && p.toks[p.i] == "--random-fully"
		if random {
			p.i++
		}
		return Masquerade(random), nil
	}
	return JumpTo(name), nil
}
