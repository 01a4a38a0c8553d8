package vm

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestRelay relays to a server on the loopback: the bytes go both ways,
// and a connection still open when the test ends is closed by then.
func TestRelay(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					fmt.Fprintf(c, "echo %s", line)
				}
			}()
		}
	}()
	var held net.Conn
	t.Run("relay", func(t *testing.T) {
		addr := relay(t, nil, "127.0.0.1:0", l.Addr().String())
		for i := range 3 {
			c, err := net.DialTimeout("tcp", addr.String(), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			fmt.Fprintf(c, "hello %d\n", i)
			got, err := bufio.NewReader(c).ReadString('\n')
			if want := fmt.Sprintf("echo hello %d\n", i); err != nil || got != want {
				t.Errorf("through the relay: %q, %v; want %q", got, err, want)
			}
			if i < 2 {
				c.Close()
			} else {
				held = c
			}
		}
	})
	// The subtest has ended: the relay closed the connection it held.
	_ = held.SetDeadline(time.Now().Add(10 * time.Second))
	if n, err := held.Read(make([]byte, 1)); err == nil {
		t.Errorf("the relay's connection is still open after its test ended (read %d bytes)", n)
	}
	held.Close()
}

func TestCopyBinary(t *testing.T) {
	dir := t.TempDir()
	from, to := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := os.WriteFile(from, []byte("#!/bin/sh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := CopyBinary(from, to); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(to)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(to); string(b) != "#!/bin/sh\n" || st.Mode().Perm() != 0o755 {
		t.Errorf("copy holds %q, mode %v; want the source's bytes, mode 0755", b, st.Mode().Perm())
	}
	if err := CopyBinary(filepath.Join(dir, "missing"), to); err == nil {
		t.Error("copying a missing file succeeded")
	}
}
