package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/edgeproxy/edgeproxy/policy/abi"
)

// commit is set by the build (-ldflags "-X main.commit=..."); without it the
// VCS revision the Go toolchain recorded is used.
var commit = ""

// buildInfo is what `edgeproxy version` reports.
type buildInfo struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
	// PolicyABI lists the policy module ABI versions this binary loads, and
	// MarkerExports the export each of them is declared by. Minor versions
	// only add optional exports, so every minor from 0 to PolicyABIMinor of
	// a major loads.
	PolicyABI      []int    `json:"policyABI"`
	PolicyABIMinor int      `json:"policyABIMinor"`
	MarkerExports  []string `json:"policyABIMarkers"`
}

func currentBuild() buildInfo {
	b := buildInfo{
		Version:        version,
		Commit:         commit,
		GoVersion:      runtime.Version(),
		Platform:       runtime.GOOS + "/" + runtime.GOARCH,
		PolicyABI:      []int{abi.Version},
		PolicyABIMinor: abi.Minor,
		MarkerExports:  []string{abi.MarkerExport},
	}
	if b.Commit == "" {
		b.Commit = vcsRevision()
	}
	return b
}

// vcsRevision is the commit the toolchain stamped into the binary, with
// "-dirty" when the tree had changes, or "unknown".
func vcsRevision() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "", false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "unknown"
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
}

func runVersion(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	out := fs.String("o", "text", "")
	if err := fs.Parse(args); err != nil {
		return usageError("%v", err)
	}
	if fs.NArg() > 0 {
		return usageError("unexpected argument %q", fs.Arg(0))
	}
	b := currentBuild()
	switch *out {
	case "json":
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(b)
	case "text":
		// The first line stays "edgeproxy VERSION" as before, for scripts.
		fmt.Fprintf(stdout, "edgeproxy %s\ncommit: %s\ngo: %s %s\n", b.Version, b.Commit, b.GoVersion, b.Platform)
		for i, v := range b.PolicyABI {
			fmt.Fprintf(stdout, "policy ABI: %d.0 to %d.%d (modules exporting %s)\n", v, v, b.PolicyABIMinor, b.MarkerExports[i])
		}
		return nil
	default:
		return usageError("-o %q: want text or json", *out)
	}
}
