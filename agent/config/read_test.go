package config

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Defects 3 and 4 of issue 14: a config that is a FIFO, a device or larger
// than MaxFileSize is refused at once, before any parsing.
func TestLoadRefusesNonRegularAndHugeFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skipf("cannot make a FIFO: %v", err)
	}
	huge := filepath.Join(dir, "huge.yaml")
	f, err := os.Create(huge)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(MaxFileSize + 1); err != nil { // sparse: no disk used
		t.Fatal(err)
	}
	f.Close()
	for path, want := range map[string]string{fifo: "not a regular file", "/dev/zero": "not a regular file", huge: "over the limit"} {
		done := make(chan error, 1)
		go func() {
			_, err := Load(LoadOptions{File: path, Hostname: fixedHost("h")})
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %v, want %q", path, err, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: Load does not return", path)
		}
	}
}
