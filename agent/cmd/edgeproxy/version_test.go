package main

import (
	"bytes"
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/policy/abi"
)

func TestVersion(t *testing.T) {
	defer func(v, c string) { version, commit = v, c }(version, commit)
	version, commit = "1.2.3", "abcdef012345"

	var out, errb bytes.Buffer
	if code := run([]string{"version"}, &out, &errb); code != 0 {
		t.Fatalf("version: exit %d: %s", code, errb.String())
	}
	want := "edgeproxy 1.2.3\ncommit: abcdef012345\ngo: " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH +
		"\npolicy ABI: 1.0 to 1.1 (modules exporting edgeproxy_abi_v1)\n"
	if out.String() != want {
		t.Errorf("version:\n%s\nwant:\n%s", out.String(), want)
	}

	out.Reset()
	if code := run([]string{"version", "-o", "json"}, &out, &errb); code != 0 {
		t.Fatalf("version -o json: exit %d: %s", code, errb.String())
	}
	var b buildInfo
	if err := json.Unmarshal(out.Bytes(), &b); err != nil {
		t.Fatal(err)
	}
	if b.Version != "1.2.3" || b.Commit != "abcdef012345" || b.GoVersion != runtime.Version() ||
		len(b.PolicyABI) != 1 || b.PolicyABI[0] != abi.Version || b.PolicyABIMinor != abi.Minor || b.MarkerExports[0] != abi.MarkerExport {
		t.Errorf("version -o json: %+v", b)
	}

	// Without a commit from the build, the toolchain's record or "unknown".
	commit = ""
	if got := currentBuild().Commit; got == "" {
		t.Error("empty commit without -X main.commit")
	}

	for _, args := range [][]string{{"version", "-o", "yaml"}, {"version", "extra"}} {
		errb.Reset()
		if code := run(args, &out, &errb); code != 2 || !strings.Contains(errb.String(), "Usage:") {
			t.Errorf("%q: exit %d, want 2 with usage", args, code)
		}
	}
}
