// Package modbuild builds policy modules from source for tests, so that
// `go test` works on a fresh checkout without `make modules` and no .wasm
// file is ever checked in: Go modules with the Go toolchain, Rust modules
// (modules/rust/NAME) with Debian's rustc and cargo, C modules
// (modules/c/NAME.c) with clang for wasm32-wasi. Builds are cached by a
// hash of the sources and the toolchain version under the user cache dir
// (or $EDGEPROXY_MODULE_CACHE).
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

// Examples returns the example modules, as paths relative to the root:
// every directory directly under modules/ whose main.go is a main package
// ("modules/topology"), every Rust module crate under modules/rust
// ("modules/rust/topology") and every C module modules/c/NAME.c.
func Examples(root string) ([]string, error) {
	out, err := goExamples(root)
	if err != nil {
		return nil, err
	}
	ents, _ := os.ReadDir(filepath.Join(root, "modules", "rust"))
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(root, "modules", "rust", e.Name(), "Cargo.toml"))
		if err == nil && strings.Contains(string(b), `"cdylib"`) {
			out = append(out, "modules/rust/"+e.Name())
		}
	}
	cs, _ := filepath.Glob(filepath.Join(root, "modules", "c", "*.c"))
	for _, c := range cs {
		out = append(out, "modules/c/"+filepath.Base(c))
	}
	return out, nil
}

func goExamples(root string) ([]string, error) {
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

// Module builds the module at dir (relative to the repository root) and
// returns the path of the .wasm file, reusing a cached build when the
// sources are unchanged: a Go main package for GOOS=wasip1 GOARCH=wasm with
// -buildmode=c-shared, a Rust crate under modules/rust, or a C file under
// modules/c. A missing Rust or C toolchain is an error wrapping
// ErrNoToolchain.
func Module(root, dir string) (string, error) {
	mu.Lock()
	defer mu.Unlock()
	kind := kindOf(dir)
	var key string
	var err error
	if kind == kindGo {
		key, err = sourceKey(root, dir)
	} else {
		key, err = foreignKey(root, kind)
	}
	if err != nil {
		return "", err
	}
	cache, err := CacheDir()
	if err != nil {
		return "", err
	}
	name := strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(filepath.ToSlash(dir), "modules/"), ".c"), "/", "_")
	out := filepath.Join(cache, name+"-"+key[:16]+".wasm")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", fmt.Errorf("modbuild: %w", err)
	}
	tmp := fmt.Sprintf("%s.tmp%d", out, os.Getpid())
	var cmd *exec.Cmd
	switch kind {
	case kindRust:
		cmd = RustCommand(filepath.Join(cache, "rust-target"), filepath.Base(dir))
		cmd.Dir = filepath.Join(root, "modules", "rust")
	case kindC:
		cmd = CCommand(tmp, filepath.Base(dir))
		cmd.Dir = filepath.Join(root, "modules", "c")
	default:
		cmd = exec.Command("go", "build", "-trimpath", "-buildmode=c-shared", "-o", tmp, "./"+filepath.ToSlash(dir))
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("modbuild: build %s: %s: %w\n%s", dir, strings.Join(cmd.Args, " "), err, b)
	}
	if kind == kindRust {
		built := filepath.Join(cache, "rust-target", "wasm32-unknown-unknown", "release", strings.ReplaceAll(filepath.Base(dir), "-", "_")+".wasm")
		if err := copyFile(built, tmp); err != nil {
			return "", fmt.Errorf("modbuild: %w", err)
		}
	}
	if err := os.Rename(tmp, out); err != nil {
		return "", fmt.Errorf("modbuild: %w", err)
	}
	return out, nil
}

// sourceKey hashes the Go version, go.mod, go.sum and the .go files of dir,
// the SDK (with jsoncfg), the hostile modules' misbehave and policy/abi.
func sourceKey(root, dir string) (string, error) {
	h := sha256.New()
	fmt.Fprintln(h, runtime.Version())
	for _, f := range []string{"go.mod", "go.sum"} {
		b, _ := os.ReadFile(filepath.Join(root, f))
		h.Write(b)
	}
	for _, d := range []string{dir, "modules/sdk", "modules/sdk/jsoncfg", "modules/testdata/hostile/misbehave", "policy/abi"} {
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
// tests need it and `.ci/run` has it. A missing Rust or C toolchain skips
// the test, saying so, only when not root (test/deps.sh installs them as
// root) and EDGEPROXY_REQUIRE_ALL is not 1.
func Build(t testing.TB, dir string) []byte {
	t.Helper()
	root, err := Root()
	if err != nil {
		t.Fatal(err)
	}
	p, err := Module(root, dir)
	if errors.Is(err, ErrNoToolchain) && os.Getuid() != 0 && os.Getenv("EDGEPROXY_REQUIRE_ALL") != "1" {
		t.Skipf("%v (test/deps.sh installs it as root)", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ErrNoToolchain is wrapped by Module's error when the Rust or C toolchain
// is not installed.
var ErrNoToolchain = errors.New("toolchain not installed")

type kind int

const (
	kindGo kind = iota
	kindRust
	kindC
)

func kindOf(dir string) kind {
	dir = filepath.ToSlash(dir)
	switch {
	case strings.HasPrefix(dir, "modules/rust/"):
		return kindRust
	case strings.HasPrefix(dir, "modules/c/") && strings.HasSuffix(dir, ".c"):
		return kindC
	}
	return kindGo
}

// Debian's own toolchains, named by path: a rustup toolchain earlier in
// PATH must not be used (CI has none).
const (
	Rustc = "/usr/bin/rustc"
	Cargo = "/usr/bin/cargo"
	Clang = "/usr/bin/clang"
)

// RustCommand returns the command, to run in modules/rust, that builds the
// crate named name for wasm32-unknown-unknown into targetDir, offline,
// with Debian's rustc and cargo (modules/build.sh runs the same).
func RustCommand(targetDir, name string) *exec.Cmd {
	cmd := exec.Command(Cargo, "build", "--offline", "--release", "--locked", "--target", "wasm32-unknown-unknown", "-p", name)
	cmd.Env = append(os.Environ(), "RUSTC="+Rustc, "CARGO_TARGET_DIR="+targetDir)
	return cmd
}

// CCommand returns the command, to run in modules/c, that builds the C
// module file into out with clang for wasm32-wasi as a reactor.
func CCommand(out, file string) *exec.Cmd {
	return exec.Command(Clang, "--target=wasm32-wasi", "-mexec-model=reactor", "-mbulk-memory", "-O2", "-Wall", "-Wextra", "-Werror",
		"-Wl,--strip-all", "-o", out, file)
}

// foreignKey hashes the toolchain's version and every source file of the
// Rust workspace or the C directory.
func foreignKey(root string, k kind) (string, error) {
	tool, sub := Rustc, "rust"
	if k == kindC {
		tool, sub = Clang, "c"
	}
	if _, err := os.Stat(tool); err != nil {
		return "", fmt.Errorf("modbuild: %s: %w", tool, ErrNoToolchain)
	}
	v, err := exec.Command(tool, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("modbuild: %s --version: %w", tool, err)
	}
	h := sha256.New()
	h.Write(v)
	base := filepath.Join(root, "modules", sub)
	err = filepath.WalkDir(base, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() && e.Name() == "target" {
			return fs.SkipDir
		}
		switch filepath.Ext(p) {
		case ".rs", ".toml", ".lock", ".c", ".h":
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(base, p)
			fmt.Fprintf(h, "%s %d\n", rel, len(b))
			h.Write(b)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("modbuild: hash %s: %w", base, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o644)
}
