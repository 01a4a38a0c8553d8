// Package abi is version 1.1 of the edgeproxy policy ABI: the values a policy
// module receives and returns, their wire encoding, the names and
// signatures of the exports a module provides and the imports it may use,
// and the rules every output must follow. ABI.md is the contract for module
// authors in any language; this package is its reference implementation,
// shared by the host (package policy) and the Go SDK (modules/sdk).
//
// The package uses only the standard library so that it builds for
// GOOS=wasip1 as well as for the host.
package abi

// Version is the ABI version this package implements. A module declares it by
// exporting MarkerExport; the input and output encodings start with it.
const Version = 1

// Minor is the ABI's minor version. Minor versions only add optional
// exports: 1.1 adds BatchExport. A module built for 1.0 runs unchanged.
const Minor = 1

// MaxWeight is the largest weight a module may give an endpoint. It equals
// datapath.MaxWeight and fits IPVS's signed 32-bit weight.
const MaxWeight = 10000

// Limits on what a module may return.
const (
	MaxReasonLen    = 256 // bytes of the reason string
	MaxSchedulerLen = 16  // bytes of the scheduler name
	MaxFlags        = 4   // scheduler flags
)

// Export names and the signatures the host requires (wasm value types
// in parentheses: params -> results).
const (
	// MarkerExport: () -> (). Its presence declares ABI version 1.
	MarkerExport = "edgeproxy_abi_v1"
	// AllocExport: (size i32) -> (ptr i32). Returns guest memory for size
	// bytes that stays valid until the next call of any export.
	AllocExport = "ep_alloc"
	// InitExport: (ptr i32, len i32) -> (status i32). Hands the module its
	// config (JSON) once, after _initialize. 0 is success.
	InitExport = "ep_init"
	// EvaluateExport: (ptr i32, len i32) -> (packed i64). Evaluates one
	// encoded Input; returns ptr<<32 | len of the encoded Output in guest
	// memory. A length of 0 means failure.
	EvaluateExport = "ep_evaluate"
	// BatchExport: (ptr i32, len i32) -> (packed i64), optional (ABI
	// 1.1). Evaluates a batch of encoded Inputs (see AppendBatch) in one
	// call; returns ptr<<32 | len of the encoded batch of Outputs, in
	// which an empty item reports a failure for that input only. A length
	// of 0 fails the whole batch (the host then calls EvaluateExport once
	// per input).
	BatchExport = "ep_evaluate_batch"
	// InitializeExport: () -> (), optional. The WASI reactor initializer
	// (Go's -buildmode=c-shared, Rust cdylib); called once before anything
	// else.
	InitializeExport = "_initialize"
	// MemoryExport is the exported memory the host reads and writes.
	MemoryExport = "memory"
)

// HostModule is the import module name of the functions the host provides.
const HostModule = "edgeproxy"

// LogImport: (level i32, ptr i32, len i32) -> (). Writes a log line; level is
// one of the Level* constants. Lines are truncated and rate limited.
const LogImport = "log"

// Log levels for LogImport.
const (
	LevelDebug = 0
	LevelInfo  = 1
	LevelWarn  = 2
	LevelError = 3
)

// ValType is a WebAssembly value type as encoded in the binary format.
type ValType byte

const (
	I32 ValType = 0x7f
	I64 ValType = 0x7e
	F32 ValType = 0x7d
	F64 ValType = 0x7c
)

// Signature is a function type.
type Signature struct {
	Params, Results []ValType
}

// Exports lists every function export the host looks for, with its exact
// signature, and whether it must be present.
var Exports = []struct {
	Name     string
	Sig      Signature
	Required bool
}{
	{MarkerExport, Signature{}, true},
	{AllocExport, Signature{[]ValType{I32}, []ValType{I32}}, true},
	{InitExport, Signature{[]ValType{I32, I32}, []ValType{I32}}, true},
	{EvaluateExport, Signature{[]ValType{I32, I32}, []ValType{I64}}, true},
	{BatchExport, Signature{[]ValType{I32, I32}, []ValType{I64}}, false},
	{InitializeExport, Signature{}, false},
}

// Imports is the allow-list: every function a module may import, keyed by
// "module.name", with its exact signature. It holds the WASI preview 1
// functions the Go, Rust and C (wasi-libc) runtimes call while starting up,
// writing to stdout/stderr and reading clocks and random bytes, and the
// host's own log function. The host runs modules with no preopened
// directories, no arguments, no environment, a fake clock and a
// deterministic random source, so these give a module nothing to reach.
// Everything else — path_open, sock_*, fd_readdir, … — is refused.
var Imports = map[string]Signature{
	"wasi_snapshot_preview1.args_get":            {[]ValType{I32, I32}, []ValType{I32}},
	"wasi_snapshot_preview1.args_sizes_get":      {[]ValType{I32, I32}, []ValType{I32}},
	"wasi_snapshot_preview1.environ_get":         {[]ValType{I32, I32}, []ValType{I32}},
	"wasi_snapshot_preview1.environ_sizes_get":   {[]ValType{I32, I32}, []ValType{I32}},
	"wasi_snapshot_preview1.clock_res_get":       {[]ValType{I32, I32}, []ValType{I32}},
	"wasi_snapshot_preview1.clock_time_get":      {[]ValType{I32, I64, I32}, []ValType{I32}},
	"wasi_snapshot_preview1.fd_close":            {[]ValType{I32}, []ValType{I32}},
	"wasi_snapshot_preview1.fd_fdstat_get":       {[]ValType{I32, I32}, []ValType{I32}},
	"wasi_snapshot_preview1.fd_fdstat_set_flags": {[]ValType{I32, I32}, []ValType{I32}},
	"wasi_snapshot_preview1.fd_prestat_get":      {[]ValType{I32, I32}, []ValType{I32}},
	"wasi_snapshot_preview1.fd_prestat_dir_name": {[]ValType{I32, I32, I32}, []ValType{I32}},
	"wasi_snapshot_preview1.fd_read":             {[]ValType{I32, I32, I32, I32}, []ValType{I32}},
	"wasi_snapshot_preview1.fd_seek":             {[]ValType{I32, I64, I32, I32}, []ValType{I32}},
	"wasi_snapshot_preview1.fd_write":            {[]ValType{I32, I32, I32, I32}, []ValType{I32}},
	"wasi_snapshot_preview1.poll_oneoff":         {[]ValType{I32, I32, I32, I32}, []ValType{I32}},
	"wasi_snapshot_preview1.proc_exit":           {[]ValType{I32}, nil},
	"wasi_snapshot_preview1.random_get":          {[]ValType{I32, I32}, []ValType{I32}},
	"wasi_snapshot_preview1.sched_yield":         {nil, []ValType{I32}},
	HostModule + "." + LogImport:                 {[]ValType{I32, I32, I32}, nil},
}

// Schedulers are the IPVS scheduler names a module may choose, with the
// scheduler flags each accepts.
var Schedulers = map[string][]string{
	"rr": nil, "wrr": nil, "lc": nil, "wlc": nil, "lblc": nil, "lblcr": nil,
	"dh": nil, "sed": nil, "nq": nil, "fo": nil, "ovf": nil, "twos": nil,
	"sh": {"sh-fallback", "sh-port"},
	"mh": {"mh-fallback", "mh-port"},
}
