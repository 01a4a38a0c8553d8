package vm

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestModuleOrderPutsDependenciesFirst(t *testing.T) {
	dir := t.TempDir()
	dep := "kernel/a.ko: kernel/b.ko kernel/c.ko\nkernel/b.ko: kernel/c.ko\nkernel/c.ko:\nkernel/d.ko:\n"
	os.WriteFile(filepath.Join(dir, "modules.dep"), []byte(dep), 0o644)
	os.WriteFile(filepath.Join(dir, "modules.builtin"), []byte("kernel/virtio.ko\n"), 0o644)
	got, err := moduleOrder(dir, []string{"a", "virtio", "c"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"kernel/c.ko", "kernel/b.ko", "kernel/a.ko"}
	if !slices.Equal(got, want) {
		t.Errorf("order = %v, want %v", got, want)
	}
	if _, err := moduleOrder(dir, []string{"nosuch"}); err == nil {
		t.Error("a missing module gave no error")
	}
}

func TestCPIONewc(t *testing.T) {
	var b bytes.Buffer
	c := newCPIOWriter(&b)
	c.Dir("bin", 0o755)
	c.File("bin/x", 0o755, []byte("abc"))
	c.CharDev("dev/console", 0o600, 5, 1)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	if b.Len()%4 != 0 {
		t.Errorf("archive length %d is not 4-aligned", b.Len())
	}
	// The first header: magic, then mode 040755 in hex.
	if s[:6] != "070701" || s[14:22] != "000041ED" {
		t.Errorf("first header = %q", s[:40])
	}
	if !bytes.Contains(b.Bytes(), []byte("TRAILER!!!\x00")) || !bytes.Contains(b.Bytes(), []byte("bin/x\x00")) {
		t.Error("names missing from the archive")
	}
}
