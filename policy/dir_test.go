package policy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// DirProblem names what os.MkdirAll reports only as "file exists" (issue
// 29 §7: a stateDir that is a symlink loop).
func TestDirProblem(t *testing.T) {
	dir := t.TempDir()
	loop := filepath.Join(dir, "loop")
	dangling := filepath.Join(dir, "dangling")
	file := filepath.Join(dir, "file")
	for _, err := range []error{
		os.Symlink(loop, loop),
		os.Symlink(filepath.Join(dir, "nowhere", "x"), dangling),
		os.WriteFile(file, nil, 0o600),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ path, want string }{
		{loop, loop + " is a loop of symbolic links"},
		{filepath.Join(loop, "wasm-cache"), loop + " is a loop of symbolic links"},
		{dangling, dangling + " is a symbolic link to " + filepath.Join(dir, "nowhere", "x") + ", which does not exist"},
		{filepath.Join(file, "wasm-cache"), file + " is not a directory"},
		{filepath.Join(dir, "new", "wasm-cache"), ""},
		{dir, ""},
	} {
		got := DirProblem(tc.path)
		if (got == nil) != (tc.want == "") || got != nil && !strings.Contains(got.Error(), tc.want) {
			t.Errorf("DirProblem(%s) = %v, want %q", tc.path, got, tc.want)
		}
		if tc.want == "" {
			continue
		}
		// Each is a path MkdirAll cannot make, so the host names it.
		_, err := NewHost(t.Context(), Options{Engine: Compiler, CacheDir: tc.path})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewHost with CacheDir %s: %v, want %q", tc.path, err, tc.want)
		}
	}
}
