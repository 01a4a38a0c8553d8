package vm

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
)

func needVM(t *testing.T) {
	t.Helper()
	if err := Check(); err != nil {
		gate.Skip(t, err.Error())
	}
}

// TestBoot boots once and checks what every guest test relies on: IPVS and
// dummy links work, modules autoload through the real root's modprobe, the
// shared directory is writable, the host's root is read-only and the
// script's exit status comes back.
func TestBoot(t *testing.T) {
	needVM(t)
	// The guest reaches the host's loopback through qemu's user network at
	// 10.0.2.2, as the agent will reach a test API server.
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	defer func() { l.Close(); <-done }()
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, "hello from the host")
			c.Close()
		}
	}()
	port := l.Addr().(*net.TCPAddr).Port
	dir := t.TempDir()
	script := fmt.Sprintf(`
set -x
test "$EDGEPROXY_IN_VM" = 1 || exit 10
test "$GREETING" = "it's here" || exit 11
cat /proc/net/ip_vs >ipvs.txt || exit 12
ip link add ep0 type dummy || exit 13
ip addr add 10.96.0.1/32 dev ep0 || exit 14
ip -o addr show dev ep0 >dummy.txt
# module autoload through /sbin/modprobe of the switched-to root
ip link add vb0 type vrf table 10 && echo autoload-ok >autoload.txt
touch /usr/cannot-write 2>/dev/null && exit 15
ip -o addr show dev eth0 | grep -q 10.0.2.15/24 || exit 16
echo hello >hello.txt
busybox nc -w 10 10.0.2.2 %d </dev/null >host.txt
exit 7
`, port)
	res, err := Run(context.Background(), Options{Dir: dir, Script: script, Env: []string{"GREETING=it's here"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("accel %s, boot %s, run %s", res.Accel, res.Boot, res.Elapsed)
	if res.ExitCode != 7 {
		t.Fatalf("exit status %d, want 7; output:\n%s\nconsole:\n%s", res.ExitCode, res.Output, tail(res.Console, 4000))
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("guest wrote no %s: %v\noutput:\n%s", name, err, res.Output)
		}
		return string(b)
	}
	if got := read("hello.txt"); got != "hello\n" {
		t.Errorf("hello.txt = %q", got)
	}
	if got := read("ipvs.txt"); !strings.Contains(got, "IP Virtual Server version") {
		t.Errorf("/proc/net/ip_vs = %q", got)
	}
	if got := read("dummy.txt"); !strings.Contains(got, "10.96.0.1/32") {
		t.Errorf("dummy link addresses = %q", got)
	}
	if got := read("autoload.txt"); got != "autoload-ok\n" {
		t.Errorf("autoload = %q", got)
	}
	if got := read("host.txt"); got != "hello from the host\n" {
		t.Errorf("guest -> host 10.0.2.2: got %q", got)
	}
	// The first line is the host's (the accelerator, and why: a failed
	// KVM probe says so there); the guest's preparation follows.
	accelLine, guest, _ := strings.Cut(string(res.Output), "\n")
	if !strings.HasPrefix(accelLine, "edgeproxy-vm: accel "+res.Accel) {
		t.Errorf("output's first line = %q, want the accelerator %q", accelLine, res.Accel)
	}
	if strings.Contains(guest, "failed") {
		t.Errorf("guest preparation reported failures:\n%s", res.Output)
	}
}
