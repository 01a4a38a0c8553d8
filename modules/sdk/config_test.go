package sdk

import (
	"bytes"
	"encoding/json"
	"testing"
)

// TestParseConfig: ParseConfig reads what encoding/json reads, refuses
// what it refuses, and looks fields up as it fills a struct.
func TestParseConfig(t *testing.T) {
	good := []string{`{}`, ` {"a": [1, -2.5e3, "x\u00e9\ud83d\ude00\n", true, false, null], "b": {"c": {}}} `, `"\ud800"`, `[]`, `0`, "\"\xff\""}
	for _, s := range good {
		v, err := ParseConfig([]byte(s))
		if err != nil {
			t.Errorf("%s: %v", s, err)
			continue
		}
		want, err := decodeAny([]byte(s))
		if err != nil {
			t.Fatalf("%s: encoding/json: %v", s, err)
		}
		if got := toAny(v); !equalJSON(got, want) {
			t.Errorf("%s: %#v, want %#v", s, got, want)
		}
	}
	for _, s := range []string{``, `{`, `{"a"}`, `{"a":1,}`, `[1 2]`, `01`, `1.`, `-`, `tru`, `"a`, "\"\x01\"", `"\x"`, `{} x`, `{1:2}`} {
		if _, err := ParseConfig([]byte(s)); err == nil {
			t.Errorf("%q accepted", s)
		}
		if json.Valid([]byte(s)) {
			t.Errorf("%q: encoding/json takes it", s)
		}
	}
	deep := make([]byte, 0, 200)
	for range 65 {
		deep = append(deep, '[')
	}
	if _, err := ParseConfig(deep); err == nil {
		t.Error("65 levels of nesting accepted")
	}
	v, _ := ParseConfig([]byte(`{"minEndpoints": 1, "MINENDPOINTS": 3, "levels": null, "n": "7"}`))
	if f, ok := v.Field("minEndpoints"); !ok || f.Text != "3" {
		t.Errorf("Field: %+v %v, want the last key in any case", f, ok)
	}
	if _, ok := v.Field("levels"); ok {
		t.Error("a null field is present")
	}
	if n, ok := v.Field("n"); ok {
		if _, ok := n.Int(); ok {
			t.Error("a string is an Int")
		}
	}
	if f, _ := v.Field("minEndpoints"); true {
		if n, ok := f.Int(); !ok || n != 3 {
			t.Errorf("Int: %d %v", n, ok)
		}
	}
}

// decodeAny decodes b with encoding/json into an any, numbers as text.
func decodeAny(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

// toAny converts v the way encoding/json decodes into an any.
func toAny(v Value) any {
	switch v.Kind {
	case Bool:
		return v.Text == "true"
	case Number:
		return json.Number(v.Text)
	case String:
		return v.Text
	case Array:
		a := []any{}
		for _, it := range v.Items {
			a = append(a, toAny(it))
		}
		return a
	case Object:
		m := map[string]any{}
		for k, it := range v.Items {
			m[v.Keys[k]] = toAny(it)
		}
		return m
	}
	return nil
}

func equalJSON(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

// FuzzParseConfig: ParseConfig accepts exactly what encoding/json accepts
// (below its nesting limit), reads the same values, and never panics.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":[1,"x\u00e9"],"A":null}`, `"\ud83d\ude00\ud800"`, `[-0.5e+2]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := ParseConfig(b)
		if err != nil && err.Error() == "json: nested too deep" {
			return
		}
		if (err == nil) != json.Valid(b) {
			t.Fatalf("%q: ParseConfig %v, json.Valid %v", b, err, json.Valid(b))
		}
		if err != nil {
			return
		}
		want, _ := decodeAny(b)
		if got := toAny(v); !equalJSON(got, want) {
			t.Fatalf("%q: %#v, want %#v", b, got, want)
		}
	})
}
