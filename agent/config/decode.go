package config

import (
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
)

// FieldError is one problem with one configuration key. Its text is
// "config: <key>: <problem>", e.g.
//
//	config: sync.minPeriod: "abc" is not a duration
//
// Load and Validate return every FieldError they find, joined with
// errors.Join; use errors.As to pick them out.
type FieldError struct {
	Key string // dotted key, e.g. "sync.minPeriod" or "policy.chains[0].name"
	Msg string
}

func (e *FieldError) Error() string { return "config: " + e.Key + ": " + e.Msg }

func fieldErr(key, format string, args ...any) error {
	return &FieldError{Key: key, Msg: fmt.Sprintf(format, args...)}
}

var (
	durationType = reflect.TypeFor[time.Duration]()
	sizeType     = reflect.TypeFor[Size]()
)

// leaf is a key of the schema that env vars and flags can set: a scalar or
// a list of strings.
type leaf struct {
	key   string // dotted, as written in YAML
	index []int  // reflect field path from Config
}

// schema holds every settable leaf key of Config, found by walking the
// koanf tags once.
var schema = buildSchema()

type schemaIndex struct {
	leaves []leaf
	// byNorm maps normKey(key) to the leaf, for env vars and flags, whose
	// spelling differs (EDGEPROXY_SYNC_MINPERIOD, --node-name).
	byNorm map[string]leaf
}

// normKey folds a key for matching env var and flag names: lower case, with
// '.', '_' and '-' removed. "sync.minPeriod", "SYNC_MIN_PERIOD" and
// "sync-min-period" all become "syncminperiod".
func normKey(s string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '.', '_', '-':
			return -1
		}
		return r
	}, strings.ToLower(s))
}

func buildSchema() schemaIndex {
	s := schemaIndex{byNorm: map[string]leaf{}}
	var walk func(t reflect.Type, prefix string, index []int)
	walk = func(t reflect.Type, prefix string, index []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			tag := f.Tag.Get("koanf")
			if tag == "" || tag == "-" {
				continue
			}
			key := prefix + tag
			idx := append(slices.Clone(index), i)
			ft := f.Type
			switch {
			case ft.Kind() == reflect.Struct:
				walk(ft, key+".", idx)
				continue
			case ft.Kind() == reflect.Map,
				ft.Kind() == reflect.Slice && ft.Elem().Kind() != reflect.String:
				continue // lists of modules and chains: only in the file
			}
			l := leaf{key: key, index: idx}
			n := normKey(key)
			if prev, dup := s.byNorm[n]; dup {
				panic(fmt.Sprintf("config: keys %s and %s fold to the same env name", prev.key, key))
			}
			s.byNorm[n] = l
			s.leaves = append(s.leaves, l)
		}
	}
	walk(reflect.TypeFor[Config](), "", nil)
	return s
}

// Keys returns every key that env vars and flags can set, dotted as in
// YAML (e.g. "sync.minPeriod"), in schema order.
func Keys() []string {
	out := make([]string, len(schema.leaves))
	for i, l := range schema.leaves {
		out[i] = l.key
	}
	return out
}

// decoder turns the generic maps koanf merged (from YAML, env vars and
// flags) into a Config, collecting one FieldError per bad key instead of
// stopping at the first. Only keys present in the map are assigned, so
// decoding onto Default() keeps the defaults of everything not mentioned.
type decoder struct{ errs []error }

func (d *decoder) fail(key, format string, args ...any) {
	d.errs = append(d.errs, fieldErr(key, format, args...))
}

func join(prefix, key string) string {
	if prefix == "" {
		return key
	}
	return prefix + "." + key
}

// show renders a raw value for an error message: strings quoted, lists and
// mappings named rather than dumped.
func show(raw any) string {
	switch v := raw.(type) {
	case string:
		return strconv.Quote(v)
	case []any:
		return "a list"
	case map[string]any, map[any]any:
		return "a mapping"
	default:
		return fmt.Sprint(v)
	}
}

func asMap(raw any) (map[string]any, bool) {
	switch m := raw.(type) {
	case map[string]any:
		return m, true
	case map[any]any:
		out := make(map[string]any, len(m))
		for k, v := range m {
			out[fmt.Sprint(k)] = v
		}
		return out, true
	}
	return nil, false
}

func (d *decoder) decodeStruct(prefix string, v reflect.Value, m map[string]any) {
	t := v.Type()
	for _, k := range slices.Sorted(maps.Keys(m)) {
		key := join(prefix, k)
		i := fieldByTag(t, k)
		if i < 0 {
			if s := suggest(t, k); s != "" {
				d.fail(key, "unknown key (did you mean %s?)", join(prefix, s))
			} else {
				d.fail(key, "unknown key")
			}
			continue
		}
		d.decodeValue(key, v.Field(i), m[k])
	}
}

func fieldByTag(t reflect.Type, tag string) int {
	for i := range t.NumField() {
		if tg := t.Field(i).Tag.Get("koanf"); tg == tag && tg != "" && tg != "-" {
			return i
		}
	}
	return -1
}

// suggest finds the key the user probably meant: the closest one ignoring
// case, '_' and '-', at most two edits away.
func suggest(t reflect.Type, k string) string {
	best, bestDist := "", 3
	for i := range t.NumField() {
		tg := t.Field(i).Tag.Get("koanf")
		if tg == "" || tg == "-" {
			continue
		}
		if d := editDistance(normKey(tg), normKey(k)); d < bestDist && d < len(tg) {
			best, bestDist = tg, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// decodeValue assigns raw to v. A null (raw == nil) leaves v as it is:
// "sync:" with nothing under it means "the defaults".
func (d *decoder) decodeValue(key string, v reflect.Value, raw any) {
	if raw == nil {
		return
	}
	switch v.Type() {
	case durationType:
		d.decodeDuration(key, v, raw)
		return
	case sizeType:
		d.decodeSize(key, v, raw)
		return
	}

	switch v.Kind() {
	case reflect.Struct:
		m, ok := asMap(raw)
		if !ok {
			d.fail(key, "%s is not a mapping", show(raw))
			return
		}
		d.decodeStruct(key, v, m)
	case reflect.String:
		s, ok := scalarString(raw)
		if !ok {
			d.fail(key, "%s is not a string", show(raw))
			return
		}
		v.SetString(s)
	case reflect.Bool:
		d.decodeBool(key, v, raw)
	case reflect.Int, reflect.Int64, reflect.Int32:
		d.decodeInt(key, v, raw)
	case reflect.Slice:
		d.decodeSlice(key, v, raw)
	case reflect.Map:
		d.decodeMap(key, v, raw)
	default:
		d.fail(key, "cannot be set (unsupported type %s)", v.Type())
	}
}

// decodeDuration takes a Go duration string; a bare 0 is zero too.
func (d *decoder) decodeDuration(key string, v reflect.Value, raw any) {
	s, ok := raw.(string)
	if !ok {
		if n, isInt := toInt(raw); isInt && n == 0 {
			v.SetInt(0)
			return
		}
		d.fail(key, "%s is not a duration (write it with a unit, e.g. 30s or 500ms)", show(raw))
		return
	}
	dur, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil && durationSyntax(strings.TrimSpace(s)) {
		d.fail(key, "%s is too long (a duration is at most %dh, about 292 years)", show(raw), int64(math.MaxInt64/time.Hour))
		return
	}
	if err != nil {
		d.fail(key, "%s is not a duration", show(raw))
		return
	}
	v.SetInt(int64(dur))
}

// decimalHint says how to write raw when it is an integer written other
// than in decimal (0x10, 0o20, 010, 0b1, 1_000), which the YAML parser
// leaves a string (yamlParser), and "" otherwise.
func decimalHint(raw any) string {
	s, ok := raw.(string)
	if !ok {
		return ""
	}
	if n, err := strconv.ParseInt(strings.TrimSpace(s), 0, 64); err == nil {
		return fmt.Sprintf(" (write numbers in decimal: %d)", n)
	}
	return ""
}

// durationSyntax reports whether s is written as time.ParseDuration reads
// it (an optional sign, then numbers each with a unit), so that a value it
// still refuses is one that overflows.
func durationSyntax(s string) bool {
	s = strings.TrimLeft(s, "+-")
	if s == "" {
		return false
	}
	for s != "" {
		digits := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
		if digits <= 0 || strings.Count(s[:digits], ".") > 1 || s[:digits] == "." {
			return false
		}
		s = s[digits:]
		unit := strings.IndexFunc(s, func(r rune) bool { return (r >= '0' && r <= '9') || r == '.' })
		if unit < 0 {
			unit = len(s)
		}
		switch s[:unit] {
		case "ns", "us", "µs", "μs", "ms", "s", "m", "h":
		default:
			return false
		}
		s = s[unit:]
	}
	return true
}

// decodeSize takes a number of bytes or a size with a unit (ParseSize).
func (d *decoder) decodeSize(key string, v reflect.Value, raw any) {
	if n, ok := toInt(raw); ok {
		if n < 0 {
			d.fail(key, "%s is not a size (it is negative)", show(raw))
			return
		}
		v.SetInt(n)
		return
	}
	s, ok := raw.(string)
	if !ok {
		d.fail(key, "%s is not a size (e.g. 16Mi, 512Ki, 1G or a number of bytes)", show(raw))
		return
	}
	sz, err := ParseSize(s)
	if err != nil {
		d.fail(key, "%v", err)
		return
	}
	v.SetInt(int64(sz))
}

// decodeBool takes a YAML boolean or, from the environment and flags, its
// spelling as a string.
func (d *decoder) decodeBool(key string, v reflect.Value, raw any) {
	switch b := raw.(type) {
	case bool:
		v.SetBool(b)
	case string:
		p, err := strconv.ParseBool(strings.TrimSpace(b))
		if err != nil {
			d.fail(key, "%s is not a boolean (true or false)", show(raw))
			return
		}
		v.SetBool(p)
	default:
		d.fail(key, "%s is not a boolean (true or false)", show(raw))
	}
}

// decodeInt takes an integer, or its decimal spelling as a string, that
// fits v.
func (d *decoder) decodeInt(key string, v reflect.Value, raw any) {
	n, ok := toInt(raw)
	if !ok {
		if s, isStr := raw.(string); isStr {
			p, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
			n, ok = p, err == nil
		}
	}
	if !ok || v.OverflowInt(n) {
		d.fail(key, "%s is not an integer%s", show(raw), decimalHint(raw))
		return
	}
	v.SetInt(n)
}

func (d *decoder) decodeSlice(key string, v reflect.Value, raw any) {
	et := v.Type().Elem()
	if s, ok := raw.(string); ok && et.Kind() == reflect.String {
		// Env vars and flags write lists as "a,b,c".
		out := reflect.MakeSlice(v.Type(), 0, 4)
		for p := range strings.SplitSeq(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = reflect.Append(out, reflect.ValueOf(p).Convert(et))
			}
		}
		setOrNil(v, out)
		return
	}
	list, ok := raw.([]any)
	if !ok {
		d.fail(key, "%s is not a list", show(raw))
		return
	}
	out := reflect.MakeSlice(v.Type(), len(list), len(list))
	for i, item := range list {
		ik := fmt.Sprintf("%s[%d]", key, i)
		if item == nil && et.Kind() == reflect.Struct {
			d.fail(ik, "empty list item")
			continue
		}
		d.decodeValue(ik, out.Index(i), item)
	}
	setOrNil(v, out)
}

func (d *decoder) decodeMap(key string, v reflect.Value, raw any) {
	m, ok := asMap(raw)
	if !ok {
		d.fail(key, "%s is not a mapping", show(raw))
		return
	}
	out := reflect.MakeMapWithSize(v.Type(), len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		ik := join(key, k)
		switch v.Type().Elem().Kind() {
		case reflect.String:
			s, ok := scalarString(m[k])
			if !ok {
				d.fail(ik, "%s is not a string", show(m[k]))
				continue
			}
			out.SetMapIndex(reflect.ValueOf(k), reflect.ValueOf(s))
		case reflect.Interface:
			val, err := jsonValue(m[k])
			if err != nil {
				d.fail(ik, "%v", err)
				continue
			}
			if val == nil {
				out.SetMapIndex(reflect.ValueOf(k), reflect.Zero(v.Type().Elem()))
			} else {
				out.SetMapIndex(reflect.ValueOf(k), reflect.ValueOf(val))
			}
		default:
			d.fail(ik, "cannot be set (unsupported type %s)", v.Type())
		}
	}
	setOrNil(v, out)
}

// setOrNil stores an empty list or mapping as nil, so "nodePortAddresses:
// []" in a file equals the default and a reload does not see a change.
func setOrNil(v, out reflect.Value) {
	if out.Len() == 0 {
		v.SetZero()
		return
	}
	v.Set(out)
}

// jsonValue makes a YAML value safe to hand to a module as JSON: mappings
// get string keys.
func jsonValue(raw any) (any, error) {
	switch x := raw.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, v := range x {
			j, err := jsonValue(v)
			if err != nil {
				return nil, err
			}
			out[k] = j
		}
		return out, nil
	case map[any]any:
		out := make(map[string]any, len(x))
		for k, v := range x {
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("mapping key %v is not a string", k)
			}
			j, err := jsonValue(v)
			if err != nil {
				return nil, err
			}
			out[ks] = j
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, v := range x {
			j, err := jsonValue(v)
			if err != nil {
				return nil, err
			}
			out[i] = j
		}
		return out, nil
	case time.Time:
		return x.Format(time.RFC3339Nano), nil
	}
	return raw, nil
}

// scalarString accepts YAML scalars for string fields: "version: 2" in a
// label map or a numeric node name is still meant as a string.
func scalarString(raw any) (string, bool) {
	switch x := raw.(type) {
	case string:
		return x, true
	case bool, int, int64, uint64, float64:
		return fmt.Sprint(x), true
	}
	return "", false
}

func toInt(raw any) (int64, bool) {
	switch x := raw.(type) {
	case int:
		return int64(x), true
	case int64:
		return x, true
	case int32:
		return int64(x), true
	case uint64:
		if x > 1<<63-1 {
			return 0, false
		}
		return int64(x), true
	case float64:
		if x == float64(int64(x)) {
			return int64(x), true
		}
	}
	return 0, false
}
