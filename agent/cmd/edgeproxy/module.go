package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/policychain"
)

// moduleCheck runs every check a chain runs before it trusts a module and
// prints each one; it exits 1 when the module is refused.
func moduleCheck(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("module check", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	out := fs.String("o", "text", "")
	cfgPath := fs.String("config", "", "")
	pos, err := parseAnywhere(fs, args)
	if err != nil {
		return usageError("%v", err)
	}
	if len(pos) != 1 {
		return usageError("module check needs one FILE")
	}
	if err := checkOutput(*out); err != nil {
		return err
	}
	file := pos[0]
	flags := map[string]string{}
	if *cfgPath != "" {
		flags["config"] = *cfgPath
	}
	quiet := slog.New(slog.DiscardHandler)
	// The config supplies the engine, limits and sha256 pins; without one
	// the defaults apply.
	cfg, err := config.Load(config.LoadOptions{Env: os.Environ(), Flags: flags, Logger: quiet})
	if err != nil {
		return err
	}
	report, err := policychain.CheckFile(context.Background(), cfg.Policy, file, quiet)
	if report == nil {
		return err
	}
	if *out == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if jerr := enc.Encode(report); jerr != nil {
			return jerr
		}
	} else {
		fmt.Fprint(stdout, report.String())
	}
	if err != nil {
		return fmt.Errorf("module %s refused: %w", file, err)
	}
	fmt.Fprintf(stdout, "module %s passed every check\n", file)
	return nil
}
