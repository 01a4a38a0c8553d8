package agent

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"

	"github.com/edgeproxy/edgeproxy/agent/config"
)

func TestCgroupMemoryMax(t *testing.T) {
	root := t.TempDir()
	write := func(path, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	self := filepath.Join(root, "cgroup")
	write(self, "0::/system.slice/edgeproxy.service\n")
	write(filepath.Join(root, "fs/system.slice/edgeproxy.service/memory.max"), "134217728\n")
	if n, err := cgroupMemoryMax(self, filepath.Join(root, "fs")); err != nil || n != 128<<20 {
		t.Fatalf("cgroupMemoryMax = %d, %v; want 128Mi", n, err)
	}
	write(filepath.Join(root, "fs/system.slice/edgeproxy.service/memory.max"), "max\n")
	if n, err := cgroupMemoryMax(self, filepath.Join(root, "fs")); err != nil || n != 0 {
		t.Fatalf("cgroupMemoryMax of an unlimited cgroup = %d, %v; want 0", n, err)
	}
	write(self, "12:memory:/docker/abc\n") // cgroup v1 only
	if _, err := cgroupMemoryMax(self, filepath.Join(root, "fs")); err == nil {
		t.Fatal("no error without a cgroup v2 line")
	}
}

func TestSetMemoryLimit(t *testing.T) {
	t.Cleanup(func() { debug.SetMemoryLimit(goLimit) })
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if got := setMemoryLimit(config.Memory{Limit: 48 << 20}, quiet); got != 48<<20 || debug.SetMemoryLimit(-1) != 48<<20 {
		t.Fatalf("memory.limit 48Mi: set %d, runtime has %d", got, debug.SetMemoryLimit(-1))
	}
}
