// Package sysctl reads and writes kernel parameters under /proc/sys. Writes
// apply to the network namespace of the calling thread for net.* keys.
package sysctl

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Root is where the kernel exposes its parameters.
const Root = "/proc/sys"

func path(name string) string {
	if !strings.Contains(name, "/") {
		name = strings.ReplaceAll(name, ".", "/")
	}
	return filepath.Join(Root, filepath.Clean("/"+name))
}

// Get returns the value of name, given either as "net.ipv4.ip_forward" or
// "net/ipv4/ip_forward" (use the slash form when a component holds a dot,
// such as an interface name).
func Get(name string) (string, error) {
	b, err := os.ReadFile(path(name))
	if err != nil {
		return "", fmt.Errorf("sysctl: read %s: %w", name, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Set writes value to name unless it already holds it.
func Set(name, value string) error {
	if cur, err := Get(name); err == nil && cur == value {
		return nil
	}
	if err := os.WriteFile(path(name), []byte(value+"\n"), 0o644); err != nil {
		return fmt.Errorf("sysctl: set %s=%s: %w", name, value, err)
	}
	return nil
}

// Ensure sets every parameter in want and returns the failures, joined;
// the ones that could be set are set regardless.
func Ensure(want map[string]string) error {
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	var errs []error
	for _, n := range names {
		if err := Set(n, want[n]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
