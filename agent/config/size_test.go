package config

import (
	"encoding/json"
	"log/slog"
	"testing"
)

func TestParseSize(t *testing.T) {
	good := map[string]Size{
		"0": 0, "4096": 4096, "512Ki": 512 << 10, "16Mi": 16 << 20, "2Gi": 2 << 30, "1Ti": 1 << 40,
		"1k": 1000, "1K": 1000, "1M": 1e6, "1G": 1e9, "3T": 3e12, " 8Mi ": 8 << 20,
	}
	for in, want := range good {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "Mi", "-1", "+1", "1.5Gi", "16MB", "16mi", "1 Mi", "abc", "9999999999Ti"} {
		if got, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", in, got)
		}
	}
}

func TestSizeStringRoundTrip(t *testing.T) {
	for _, s := range []Size{0, 1, 1000, 1023, 1 << 10, 16 << 20, 3 << 30, 5 << 40, 1e9} {
		back, err := ParseSize(s.String())
		if err != nil || back != s {
			t.Errorf("%d -> %q -> %d, %v", s, s.String(), back, err)
		}
	}
	if got := Size(16 << 20).String(); got != "16Mi" {
		t.Errorf("String = %q", got)
	}
	b, err := json.Marshal(struct{ M Size }{64 << 10})
	if err != nil || string(b) != `{"M":"64Ki"}` {
		t.Errorf("json = %s, %v", b, err)
	}
	var back struct{ M Size }
	if err := json.Unmarshal(b, &back); err != nil || back.M != 64<<10 {
		t.Errorf("json back = %+v, %v", back, err)
	}
}

func TestLogSlogLevel(t *testing.T) {
	for in, want := range map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError} {
		if got := (Log{Level: in}).SlogLevel(); got != want {
			t.Errorf("%s: %v", in, got)
		}
	}
}
