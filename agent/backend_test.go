package agent

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// IPv6 is proxied as kube-proxy decides it: the kernel has IPv6 on and
// ip6tables works. The node's addresses play no part (ipv6Supported is
// not given them).
func TestIPv6Supported(t *testing.T) {
	works := func() error { return nil }
	broken := func() error { return errors.New("can't initialize ip6tables table `nat'") }
	for _, tc := range []struct {
		name      string
		ifInet6   bool   // /proc/net/if_inet6 exists
		disable   string // /proc/sys/net/ipv6/conf/all/disable_ipv6, "" none
		ip6tables func() error
		want      bool
	}{
		{"IPv6 on, ip6tables works", true, "0\n", works, true},
		{"no disable_ipv6 file", true, "", works, true},
		{"kernel without IPv6", false, "", works, false},
		{"IPv6 disabled", true, "1\n", works, false},
		{"ip6tables fails", true, "0\n", broken, false},
	} {
		proc := t.TempDir()
		if tc.ifInet6 {
			write(t, filepath.Join(proc, "net/if_inet6"), "")
		}
		if tc.disable != "" {
			write(t, filepath.Join(proc, "sys/net/ipv6/conf/all/disable_ipv6"), tc.disable)
		}
		err := ipv6Supported(proc, tc.ip6tables)
		if got := err == nil; got != tc.want {
			t.Errorf("%s: ipv6Supported = %v, want supported %v", tc.name, err, tc.want)
		}
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
