// Package xtables is the one driver of the iptables command-line tools that
// both datapaths use: it finds the binaries of a backend (iptables-legacy
// or iptables-nft) for an IP family, detects which backend "iptables"
// resolves to, refuses to run when our chains exist under both, and runs
// iptables, iptables-restore and iptables-save with a bounded wait for the
// xtables lock. It also holds the typed rule model both modes build their
// rules from (Rule, Match, Target, Chain, Jump), the validated
// Transaction that renders them as iptables-restore input, and, for
// tests in any package, an in-memory Fake of the tables and a packet
// tracer over it (Fake.Trace). Which rules are written is the modes'.
package xtables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath"
)

// Variant is an iptables backend.
type Variant string

const (
	Auto   Variant = ""       // whatever "iptables" resolves to
	Legacy Variant = "legacy" // iptables-legacy: x_tables
	NFT    Variant = "nft"    // iptables-nft: nf_tables with the xtables compat layer
)

// Other returns the backend that is not v (Legacy for NFT and Auto).
func (v Variant) Other() Variant {
	if v == Legacy {
		return NFT
	}
	return Legacy
}

// ErrBothBackends is returned when edgeproxy chains exist under both
// iptables-legacy and iptables-nft: packets would traverse both sets.
var ErrBothBackends = errors.New("iptables: edgeproxy chains exist in both iptables-legacy and iptables-nft; run `edgeproxy cleanup` with each variant, then start again")

// DefaultWait bounds the wait for the xtables lock when none is given.
const DefaultWait = 5 * time.Second

// Tool runs the iptables tools of one backend and one IP family in the
// calling thread's network namespace.
type Tool struct {
	Family  datapath.Family
	Variant Variant // as detected: never Auto
	// Absolute paths of iptables, iptables-restore and iptables-save.
	IPTables, Restore, Save string
	Wait                    time.Duration // for the xtables lock
}

// Binaries returns the names of iptables and iptables-restore of variant v
// for fam, e.g. "ip6tables-nft" and "ip6tables-nft-restore".
func Binaries(v Variant, fam datapath.Family) (ipt, restore string) {
	base := "iptables"
	if fam == datapath.IPv6 {
		base = "ip6tables"
	}
	if v != Auto {
		base += "-" + string(v)
	}
	return base, base + "-restore"
}

// Open finds the binaries of variant v for fam and, for Auto, detects which
// backend they are. An error wrapping *exec.Error means a binary is not
// installed.
func Open(v Variant, fam datapath.Family, wait time.Duration) (*Tool, error) {
	if wait <= 0 {
		wait = DefaultWait
	}
	iptBin, restoreBin := Binaries(v, fam)
	t := &Tool{Family: fam, Variant: v, Wait: wait}
	for _, b := range []struct {
		name string
		path *string
	}{{iptBin, &t.IPTables}, {restoreBin, &t.Restore}, {strings.TrimSuffix(restoreBin, "-restore") + "-save", &t.Save}} {
		p, err := exec.LookPath(b.name)
		if err != nil {
			return nil, fmt.Errorf("xtables: %w", err)
		}
		*b.path = p
	}
	if v == Auto {
		out, err := exec.Command(t.IPTables, "--version").CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("xtables: %s --version: %w: %s", iptBin, err, bytes.TrimSpace(out))
		}
		t.Variant = Legacy
		if bytes.Contains(out, []byte("nf_tables")) {
			t.Variant = NFT
		}
	}
	return t, nil
}

// WaitSeconds is the lock wait as the tools' -w argument: whole seconds,
// rounded up.
func (t *Tool) WaitSeconds() int { return int((t.Wait + time.Second - 1) / time.Second) }

func (t *Tool) waitArg() string { return strconv.Itoa(t.WaitSeconds()) }

// Run runs iptables with the lock wait and args and returns its output.
func (t *Tool) Run(ctx context.Context, args ...string) (string, error) {
	if t == nil {
		return "", errors.New("xtables: no iptables tool opened")
	}
	return run(ctx, t.IPTables, append([]string{"-w", t.waitArg()}, args...)...)
}

// RestoreNoFlush writes text with iptables-restore --noflush: chains it
// declares are emptied and refilled, all others are left alone; each table
// of the text is one transaction, committed at its COMMIT line.
func (t *Tool) RestoreNoFlush(ctx context.Context, text []byte) error {
	r, err := t.StartRestore(ctx)
	if err != nil {
		return err
	}
	_, _ = r.Write(text) // a failed write is reported by Commit
	_, err = r.Commit()
	return err
}

// Restore is one iptables-restore --noflush that runs while its input is
// written: started before the input is ready, its own start-up (exec,
// libraries, extensions) overlaps with what produces the input. The kernel
// sees a table at its COMMIT line only, so a Restore aborted before a
// COMMIT was written commits nothing.
type Restore struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   bytes.Buffer // standard output and error
	start time.Time
	werr  error // the first failed write
	ended bool
}

// RestoreStats is what one restore cost: its wall time from start to exit
// and the CPU time (user and system) of the iptables-restore process.
type RestoreStats struct {
	Wall, CPU time.Duration
}

// StartRestore starts iptables-restore --noflush with the lock wait; its
// input is what Write is given. End it with Commit or Abort.
func (t *Tool) StartRestore(ctx context.Context) (*Restore, error) {
	if t == nil {
		return nil, errors.New("xtables: no iptables tool opened")
	}
	cmd := exec.CommandContext(ctx, t.Restore, "--noflush", "-w", t.waitArg())
	r := &Restore{cmd: cmd}
	cmd.Stdout, cmd.Stderr = &r.out, &r.out
	var err error
	if r.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, fmt.Errorf("xtables: %s: %w", t.Restore, err)
	}
	r.start = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("xtables: start %s: %w", t.Restore, err)
	}
	return r, nil
}

// Write hands p to iptables-restore. After a failed write (the process
// ended early, e.g. on a bad line) further input is dropped; Commit then
// reports why.
func (r *Restore) Write(p []byte) (int, error) {
	if r.werr != nil {
		return 0, r.werr
	}
	n, err := r.stdin.Write(p)
	if err != nil {
		r.werr = fmt.Errorf("xtables: write to %s: %w", r.cmd.Path, err)
	}
	return n, r.werr
}

// Commit ends the input and waits for iptables-restore: the tables whose
// COMMIT it read are committed. A failure is a *RestoreError.
func (r *Restore) Commit() (RestoreStats, error) {
	if r.ended {
		return RestoreStats{}, errors.New("xtables: restore already ended")
	}
	r.ended = true
	cerr := r.stdin.Close()
	err := r.cmd.Wait()
	st := r.stats()
	switch {
	case err != nil:
		err = fmt.Errorf("xtables: %s %s: %w: %s", r.cmd.Path, strings.Join(r.cmd.Args[1:], " "), err, bytes.TrimSpace(r.out.Bytes()))
	case r.werr != nil:
		err = r.werr
	case cerr != nil:
		err = fmt.Errorf("xtables: close the input of %s: %w", r.cmd.Path, cerr)
	default:
		return st, nil
	}
	return st, &RestoreError{Line: failedLine(err.Error()), Err: err}
}

// Abort kills iptables-restore and waits for it, unless it has ended.
// Nothing of a table whose COMMIT line was not written is committed; Abort
// before any Write commits nothing at all.
func (r *Restore) Abort() {
	if r.ended {
		return
	}
	r.ended = true
	// Killed before its input ends: an input without COMMIT would be
	// refused too, but a kill does not depend on how the input ends.
	_ = r.cmd.Process.Kill()
	_ = r.stdin.Close()
	_ = r.cmd.Wait()
}

func (r *Restore) stats() RestoreStats {
	st := RestoreStats{Wall: time.Since(r.start)}
	if ps := r.cmd.ProcessState; ps != nil {
		st.CPU = ps.UserTime() + ps.SystemTime()
	}
	return st
}

// RestoreError is a failed iptables-restore. Line is the line of the input
// it reported as failed (1-based), 0 when it named none.
type RestoreError struct {
	Line int
	Err  error
}

func (e *RestoreError) Error() string { return e.Err.Error() }
func (e *RestoreError) Unwrap() error { return e.Err }

// failedLine finds the line number in iptables-restore's message: legacy
// says "line N failed", nft "line N: ..." or "Error occurred at line: N".
func failedLine(msg string) int {
	for {
		i := strings.Index(msg, "line")
		if i < 0 {
			return 0
		}
		msg = strings.TrimPrefix(strings.TrimPrefix(msg[i+len("line"):], ":"), " ")
		j := 0
		for j < len(msg) && msg[j] >= '0' && msg[j] <= '9' {
			j++
		}
		if n, err := strconv.Atoi(msg[:j]); err == nil && n > 0 {
			return n
		}
	}
}

// SaveTable returns iptables-save's listing of one table ("" for all).
func (t *Tool) SaveTable(ctx context.Context, table string) (string, error) {
	if t == nil {
		return "", errors.New("xtables: no iptables tool opened")
	}
	var args []string
	if table != "" {
		args = []string{"-t", table}
	}
	return run(ctx, t.Save, args...)
}

// ChainExists reports whether table holds chain.
func (t *Tool) ChainExists(ctx context.Context, table, chain string) bool {
	_, err := t.Run(ctx, "-t", table, "-S", chain)
	return err == nil
}

// CheckOtherBackend looks for marker (a chain only edgeproxy creates) in
// table under the other backend: present under both is ErrBothBackends;
// present under the other one only is logged, as it stays until cleanup.
// An other backend that is not installed holds nothing.
func (t *Tool) CheckOtherBackend(ctx context.Context, table, marker string, log *slog.Logger) error {
	other, err := Open(t.Variant.Other(), t.Family, t.Wait)
	if err != nil {
		return nil //nolint:nilerr // not installed: it holds no chains
	}
	theirs := (other.Variant != Legacy || LegacyTable(t.Family, table)) && other.ChainExists(ctx, table, marker)
	mine := t.ChainExists(ctx, table, marker)
	switch {
	case theirs && mine:
		return fmt.Errorf("%w (IPv%d)", ErrBothBackends, t.Family)
	case theirs:
		log.Warn("edgeproxy chains exist under the other iptables backend; they stay until `edgeproxy cleanup`", "using", t.Variant, "other", other.Variant)
	}
	return nil
}

// LegacyTable reports whether the kernel's legacy x_tables of fam hold
// table in the calling thread's network namespace. The kernel makes a
// table on its first use, so asking iptables-legacy on a node that has
// none leaves an empty legacy table behind, which iptables-nft-save then
// warns of ("iptables-legacy tables present"); look here first. When it
// cannot tell, it says yes.
func LegacyTable(fam datapath.Family, table string) bool {
	name := "ip_tables_names"
	if fam == datapath.IPv6 {
		name = "ip6_tables_names"
	}
	b, err := os.ReadFile("/proc/thread-self/net/" + name)
	if err != nil {
		return !errors.Is(err, os.ErrNotExist) // no module loaded: no table
	}
	return slices.Contains(strings.Fields(string(b)), table)
}

func run(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	// Stderr apart: iptables-nft-save warns there about legacy tables,
	// which must not reach a parsed listing.
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("xtables: %s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(append(stderr.Bytes(), out.Bytes()...)))
	}
	return out.String(), nil
}
