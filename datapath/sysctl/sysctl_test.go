package sysctl

import "testing"

func TestPath(t *testing.T) {
	for in, want := range map[string]string{
		"net.ipv4.ip_forward":               "/proc/sys/net/ipv4/ip_forward",
		"net/ipv4/conf/eth0.100/forwarding": "/proc/sys/net/ipv4/conf/eth0.100/forwarding",
		"../../etc/passwd":                  "/proc/sys/etc/passwd",
	} {
		if got := path(in); got != want {
			t.Errorf("path(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestGet(t *testing.T) {
	if _, err := Get("kernel.ostype"); err != nil {
		t.Fatal(err)
	}
	if _, err := Get("no.such.key"); err == nil {
		t.Fatal("Get of a missing key returned no error")
	}
}
