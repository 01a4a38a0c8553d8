// Package modbuild builds policy modules from source for tests, so that
// `go test` works on a fresh checkout without `make modules` and no .wasm
// file is ever checked in. Builds are cached by a hash of the sources and
// the Go version under the user cache dir (or $EDGEPROXY_MODULE_CACHE).
package modbuild

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
)

// Root returns the repository root: the nearest parent of the working
// directory holding the edgeproxy go.mod.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("modbuild: %w", err)
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.Contains(string(b), "module github.com/edgeproxy/edgeproxy\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("modbuild: repository root not found")
		}
		dir = parent
	}
}

// Examples returns the example modules: every directory directly under
// modules/ whose main.go is a main package, as paths relative to the root
// ("modules/topology").
func Examples(root string) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(root, "modules"))
	if err != nil {
		return nil, fmt.Errorf("modbuild: %w", err)
	}
	var out []string
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, "modules", e.Name(), "main.go"))
		if err == nil && strings.Contains(string(b), "\npackage main\n") {
			out = append(out, "modules/"+e.Name())
		}
	}
	return out, nil
}

// CacheDir is where built modules are kept.
func CacheDir() (string, error) {
	if d := os.Getenv("EDGEPROXY_MODULE_CACHE"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		d = os.TempDir()
	}
	return filepath.Join(d, "edgeproxy", "modules"), nil
}

var mu sync.Mutex // serializes builds within one test binary

// Module builds the main package in dir (relative to the repository root)
// for GOOS=wasip1 GOARCH=wasm with -buildmode=c-shared and returns the path
// of the .wasm file, reusing a cached build when the sources are unchanged.
func Module(root, dir string) (string, error) {
	mu.Lock()
	defer mu.Unlock()
	key, err := sourceKey(root, dir)
	if err != nil {
		return "", err
	}
	cache, err := CacheDir()
	if err != nil {
		return "", err
	}
	name := strings.ReplaceAll(strings.TrimPrefix(filepath.ToSlash(dir), "modules/"), "/", "_")
	out := filepath.Join(cache, name+"-"+key[:16]+".wasm")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", fmt.Errorf("modbuild: %w", err)
	}
	tmp := fmt.Sprintf("%s.tmp%d", out, os.Getpid())
	cmd := exec.Command("go", "build", "-trimpath", "-buildmode=c-shared", "-o", tmp, "./"+filepath.ToSlash(dir))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("modbuild: go build %s: %w\n%s", dir, err, b)
	}
	if err := os.Rename(tmp, out); err != nil {
		return "", fmt.Errorf("modbuild: %w", err)
	}
	return out, nil
}

// sourceKey hashes the Go version, go.mod, go.sum and the .go files of dir,
// modules/sdk and policy/abi.
func sourceKey(root, dir string) (string, error) {
	h := sha256.New()
	fmt.Fprintln(h, runtime.Version())
	for _, f := range []string{"go.mod", "go.sum"} {
		b, _ := os.ReadFile(filepath.Join(root, f))
		h.Write(b)
	}
	for _, d := range []string{dir, "modules/sdk", "policy/abi"} {
		var files []string
		err := filepath.WalkDir(filepath.Join(root, d), func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if e.IsDir() && p != filepath.Join(root, d) {
				return fs.SkipDir
			}
			if strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
				files = append(files, p)
			}
			return nil
		})
		if err != nil {
			return "", fmt.Errorf("modbuild: hash %s: %w", d, err)
		}
		slices.Sort(files)
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				return "", fmt.Errorf("modbuild: %w", err)
			}
			fmt.Fprintf(h, "%s %d\n", filepath.Base(f), len(b))
			h.Write(b)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Build is Module for tests: it fails t on error and returns the file's
// contents. A missing go toolchain is a hard failure, never a skip: the
// tests need it and `.ci/run` has it.
func Build(t testing.TB, dir string) []byte {
	t.Helper()
	root, err := Root()
	if err != nil {
		t.Fatal(err)
	}
	p, err := Module(root, dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
