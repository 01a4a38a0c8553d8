package policy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/edgeproxy/edgeproxy/policy/abi"
)

// Spec describes a module to load.
type Spec struct {
	// Name is the module's name in config, logs and metrics.
	Name string
	Wasm []byte
	// SHA256 optionally pins the file's hash (hex).
	SHA256 string
	// Config is the chain step's config (JSON object); nil means "{}".
	Config []byte
	// AllowEmpty lets the module drop every endpoint; otherwise an
	// all-zero output is invalid.
	AllowEmpty bool
}

// Check results.
const (
	StatusOK   = "ok"
	StatusFail = "FAIL"
	StatusSkip = "skip"
)

// CheckResult is one check of a Report.
type CheckResult struct {
	Name   string `json:"name"`
	Status string `json:"status"` // ok | FAIL | skip
	Detail string `json:"detail"`
}

// Report lists every check run on a module and its result, in order.
type Report struct {
	Module string        `json:"module"`
	SHA256 string        `json:"sha256"`
	Size   int           `json:"size"`
	Engine string        `json:"engine"`
	Checks []CheckResult `json:"checks"`
}

// OK reports whether no check failed.
func (r *Report) OK() bool { return r.Err() == nil }

// Err joins the failed checks into one error, or returns nil.
func (r *Report) Err() error {
	var errs []error
	for _, c := range r.Checks {
		if c.Status == StatusFail {
			errs = append(errs, fmt.Errorf("%s: %s", c.Name, c.Detail))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("policy: module %s refused: %w", r.Module, errors.Join(errs...))
}

// String renders one line per check, for `edgeproxy module check`.
func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "module %s  sha256:%s  %d bytes  engine %s\n", r.Module, r.SHA256, r.Size, r.Engine)
	for _, c := range r.Checks {
		fmt.Fprintf(&b, "  %-4s  %-14s %s\n", c.Status, c.Name, c.Detail)
	}
	if err := r.Err(); err != nil {
		b.WriteString("REFUSED\n")
	} else {
		b.WriteString("OK\n")
	}
	return b.String()
}

func (r *Report) add(name string, err error, okDetail string) bool {
	if err != nil {
		r.Checks = append(r.Checks, CheckResult{name, StatusFail, err.Error()})
		return false
	}
	r.Checks = append(r.Checks, CheckResult{name, StatusOK, okDetail})
	return true
}

func (r *Report) skip(detail string, names ...string) {
	for _, n := range names {
		r.Checks = append(r.Checks, CheckResult{n, StatusSkip, detail})
	}
}

// The checks, in the order they run.
var checkNames = []string{"size", "sha256", "format", "compile", "imports", "abi", "exports", "memory", "instantiate"}

// Check runs every check on spec and returns the report; the module is
// never kept. `edgeproxy module check FILE` prints it.
func (h *Host) Check(ctx context.Context, spec Spec) *Report {
	r, inst := h.check(ctx, spec)
	if inst != nil {
		inst.Close(ctx)
	}
	return r
}

// Load checks spec and, when every check passes, returns a fresh instance
// ready to evaluate, along with the report. On failure the error is the
// report's and the instance is nil. The probed instance is not kept: a
// fresh one with its warm-up call is in the same state as one re-created
// after a failure, so a module answers alike whichever it runs on (down to
// the addresses in a crash message).
func (h *Host) Load(ctx context.Context, spec Spec) (*Instance, *Report, error) {
	r, probed := h.check(ctx, spec)
	if probed == nil {
		return nil, r, r.Err()
	}
	probed.discard(ctx)
	if err := probed.instantiate(ctx, true); err != nil {
		probed.Close(ctx)
		return nil, r, fmt.Errorf("policy: module %s: %w", spec.Name, err)
	}
	return probed, r, nil
}

func (h *Host) check(ctx context.Context, spec Spec) (*Report, *Instance) {
	sum := sha256.Sum256(spec.Wasm)
	r := &Report{Module: spec.Name, SHA256: hex.EncodeToString(sum[:]), Size: len(spec.Wasm), Engine: h.engine}
	rest := func(from string) []string {
		return append(slices.Clone(checkNames[slices.Index(checkNames, from):]), probeCheckNames()...)
	}
	ok := h.checkFile(spec, r)
	if !ok {
		r.skip("not run: an earlier check failed", rest("format")...)
		return r, nil
	}
	imports, err := functionImports(spec.Wasm)
	if !r.add("format", err, fmt.Sprintf("wasm 1.0, %d function imports, no imported memory, table or global", len(imports))) {
		r.skip("not run: an earlier check failed", rest("compile")...)
		return r, nil
	}
	c, err := h.compile(ctx, r.SHA256, spec.Wasm)
	detail := "valid, compiled with the " + h.engine + ", wazero's deadline checks"
	if err == nil && c.interruptible {
		detail = "valid, compiled with the " + h.engine + ", interrupt checks inserted"
	}
	if !r.add("compile", err, detail) {
		r.skip("not run: an earlier check failed", rest("imports")...)
		return r, nil
	}
	ok = checkInterface(c.cm, r)
	if !ok {
		h.release(ctx, r.SHA256)
		r.skip("not run: an earlier check failed", "instantiate")
		r.skip("not run: an earlier check failed", probeCheckNames()...)
		return r, nil
	}
	inst := h.newInstance(spec, c)
	if !r.add("instantiate", inst.instantiate(ctx, false), "instantiated, _initialize and ep_init succeeded") {
		inst.Close(ctx)
		r.skip("not run: an earlier check failed", probeCheckNames()...)
		return r, nil
	}
	if !h.probe(ctx, inst, r) {
		inst.Close(ctx)
		return r, nil
	}
	return r, inst
}

// checkFile runs the checks on the file itself: its size and its pin.
func (h *Host) checkFile(spec Spec, r *Report) bool {
	ok := r.add("size", func() error {
		if int64(len(spec.Wasm)) > h.opts.MaxModuleSize {
			return fmt.Errorf("%d bytes, limit %d", len(spec.Wasm), h.opts.MaxModuleSize)
		}
		return nil
	}(), fmt.Sprintf("%d bytes, limit %d", len(spec.Wasm), h.opts.MaxModuleSize))
	switch {
	case spec.SHA256 == "":
		r.skip("no pin configured", "sha256")
	case !strings.EqualFold(strings.TrimPrefix(spec.SHA256, "sha256:"), r.SHA256):
		ok = r.add("sha256", fmt.Errorf("file hash %s does not match the pinned %s", r.SHA256, spec.SHA256), "") && ok
	default:
		r.add("sha256", nil, "matches the pin")
	}
	return ok
}

// functionImports parses the import section and refuses any import that
// is not a function (a memory, table or global).
func functionImports(wasm []byte) ([]wasmImport, error) {
	imports, err := parseImports(wasm)
	if err != nil {
		return imports, err
	}
	for _, im := range imports {
		if im.Kind != 0 {
			return imports, fmt.Errorf("imports a %s (%s.%s); modules may import functions only", im.kind(), im.Module, im.Name)
		}
	}
	return imports, nil
}

// checkInterface runs the checks on what a compiled module imports and
// exports: the allow-list, the ABI marker, the entry points, the memory.
func checkInterface(cm wazero.CompiledModule, r *Report) bool {
	ok := r.add("imports", checkImports(cm), fmt.Sprintf("%d imports, all on the allow-list with exact signatures", len(cm.ImportedFunctions())))
	exports := cm.ExportedFunctions()
	var abiErr error
	if f, found := exports[abi.MarkerExport]; !found {
		abiErr = fmt.Errorf("no %s export: not an edgeproxy module of ABI version %d", abi.MarkerExport, abi.Version)
		for name := range exports {
			if strings.HasPrefix(name, "edgeproxy_abi_v") {
				abiErr = fmt.Errorf("module declares %s; this host speaks %s", name, abi.MarkerExport)
			}
		}
	} else {
		abiErr = sigMismatch(f, abi.Signature{})
	}
	ok = r.add("abi", abiErr, fmt.Sprintf("declares ABI version %d", abi.Version)) && ok
	exported := "ep_alloc, ep_init, ep_evaluate"
	if _, found := exports[abi.BatchExport]; found {
		exported += ", " + abi.BatchExport
	}
	ok = r.add("exports", checkExports(exports), exported+" with exact signatures") && ok
	var memErr error
	if _, found := cm.ExportedMemories()[abi.MemoryExport]; !found {
		memErr = fmt.Errorf("no exported memory named %q", abi.MemoryExport)
	}
	return r.add("memory", memErr, "exports its memory") && ok
}

func checkImports(cm wazero.CompiledModule) error {
	var errs []error
	for _, f := range cm.ImportedFunctions() {
		mod, name, _ := f.Import()
		key := mod + "." + name
		want, ok := abi.Imports[key]
		if !ok {
			errs = append(errs, fmt.Errorf("%s is not allowed", key))
			continue
		}
		if err := sigMismatch(f, want); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", key, err))
		}
	}
	return errors.Join(errs...)
}

func checkExports(exports map[string]api.FunctionDefinition) error {
	var errs []error
	for _, e := range abi.Exports {
		if e.Name == abi.MarkerExport {
			continue
		}
		f, ok := exports[e.Name]
		if !ok {
			if e.Required {
				errs = append(errs, fmt.Errorf("missing export %s", e.Name))
			}
			continue
		}
		if err := sigMismatch(f, e.Sig); err != nil {
			errs = append(errs, fmt.Errorf("export %s: %w", e.Name, err))
		}
	}
	return errors.Join(errs...)
}

func sigMismatch(f api.FunctionDefinition, want abi.Signature) error {
	if !sameTypes(f.ParamTypes(), want.Params) || !sameTypes(f.ResultTypes(), want.Results) {
		return fmt.Errorf("signature %s, want %s", sigString(f.ParamTypes(), f.ResultTypes()), sigString(toAPI(want.Params), toAPI(want.Results)))
	}
	return nil
}

func sameTypes(got []api.ValueType, want []abi.ValType) bool {
	return bytes.Equal(got, toAPI(want))
}

func toAPI(v []abi.ValType) []api.ValueType {
	out := make([]api.ValueType, len(v))
	for i, t := range v {
		out[i] = api.ValueType(t)
	}
	return out
}

func sigString(params, results []api.ValueType) string {
	name := func(ts []api.ValueType) string {
		s := make([]string, len(ts))
		for i, t := range ts {
			s[i] = api.ValueTypeName(t)
		}
		return "(" + strings.Join(s, ", ") + ")"
	}
	return name(params) + " -> " + name(results)
}
