package config

import (
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
)

// sizeUnits are the suffixes ParseSize accepts, longest first so "Mi" is
// tried before "M". Binary suffixes (Ki, Mi, Gi, Ti) are powers of 1024,
// decimal ones (k, K, M, G, T) powers of 1000, as in Kubernetes quantities.
var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
	{"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12},
}

// ParseSize reads a byte count written as a whole number with an optional
// unit: "16Mi" (16·2^20), "512Ki", "1G" (10^9) or "4096". Fractions and
// negative sizes are rejected.
func ParseSize(s string) (Size, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range sizeUnits {
		if n, ok := strings.CutSuffix(t, u.suffix); ok {
			t, mult = n, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || t == "" || t[0] == '+' {
		if n, err := strconv.ParseInt(t, 0, 64); err == nil && n >= 0 {
			// 0x10, 0o20, 010, 1_000: what YAML and Go read in other bases
			// or with separators, and Kubernetes quantities do not.
			return 0, fmt.Errorf("%q is not a size: write it in decimal (%d), with an optional unit (e.g. 16Mi)", s, n)
		}
		return 0, fmt.Errorf("%q is not a size (e.g. 16Mi, 512Ki, 1G or a number of bytes)", s)
	}
	if n > math.MaxInt64/mult {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return Size(n * mult), nil
}

// String writes s with the largest binary unit that divides it exactly
// ("16Mi"), or as a plain number of bytes. ParseSize reads it back.
func (s Size) String() string {
	for i := 3; i >= 0; i-- {
		u := sizeUnits[i]
		if s != 0 && int64(s)%u.mult == 0 {
			return strconv.FormatInt(int64(s)/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(s), 10)
}

// MarshalText implements encoding.TextMarshaler (JSON and YAML output, e.g.
// a /debug/config endpoint, show "16Mi" rather than 16777216).
func (s Size) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParseSize.
func (s *Size) UnmarshalText(b []byte) error {
	v, err := ParseSize(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// logLevels maps the accepted log.level values to slog levels.
var logLevels = map[string]slog.Level{
	"debug": slog.LevelDebug, "info": slog.LevelInfo,
	"warn": slog.LevelWarn, "error": slog.LevelError,
}

// SlogLevel returns l.Level as a slog.Level; an unknown level (which
// Validate rejects) reads as info.
func (l Log) SlogLevel() slog.Level {
	if v, ok := logLevels[l.Level]; ok {
		return v
	}
	return slog.LevelInfo
}
