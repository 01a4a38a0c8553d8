// Package sdk lets a policy module be written in a few lines of Go. A module
// is a main package built with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o m.wasm .
//
// that registers its functions from init:
//
//	func init() { sdk.Run(sdk.Module{Evaluate: evaluate}) }
//
//	func evaluate(in *sdk.Input, out *sdk.Output) error {
//		for i, e := range in.Endpoints {
//			if !e.Local {
//				out.Weights[i] = 0
//			}
//		}
//		return nil
//	}
//
//	func main() {}
//
// The SDK provides the exports policy/abi/ABI.md requires (and the
// optional batch export of ABI 1.1), decodes the
// input, hands Evaluate an output whose weights are pre-filled with the
// input weights, encodes the result and turns errors and panics into a clean
// failure that the host counts and logs. The same code compiles for the
// host, where Call runs a module's functions directly (for unit tests).
//
// Inside the guest, under the host's per-call deadline, every call and
// every taken jump costs ~30 ns (RATIONALE.md): Evaluate should not
// allocate per call, and should compare per-endpoint strings with Equal
// rather than ==, which loops byte by byte.
package sdk

import (
	"errors"
	"runtime"

	"github.com/edgeproxy/edgeproxy/policy/abi"
)

// Aliases so that modules need only this package.
type (
	Input    = abi.Input
	Output   = abi.Output
	Service  = abi.Service
	Node     = abi.Node
	Endpoint = abi.Endpoint
	KV       = abi.KV
)

// MaxWeight is the largest weight a module may return.
const MaxWeight = abi.MaxWeight

// Schedulers lists the IPVS schedulers a module may choose, with the flags
// each takes.
var Schedulers = abi.Schedulers

// Module is what a module registers.
type Module struct {
	// Init receives the chain step's config (a JSON object, "{}" when
	// none) once, before the first Evaluate: read it with ParseConfig, or
	// with package jsoncfg into a struct. Optional.
	Init func(config []byte) error
	// Evaluate decides the weights of one service port's endpoints. out
	// arrives with one weight per endpoint, copied from the input.
	Evaluate func(in *Input, out *Output) error
}

var registered Module

// Run registers m. Call it from an init function of the main package.
func Run(m Module) { registered = m }

// Log levels.
const (
	Debug = abi.LevelDebug
	Info  = abi.LevelInfo
	Warn  = abi.LevelWarn
	Error = abi.LevelError
)

// Log writes a log line through the host (truncated and rate limited
// there). Outside wasm it does nothing. The SDK does not format: fmt and
// the reflection it needs would add a fifth to a module's code (see
// ParseConfig); a module that wants it may call fmt.Sprintf itself.
func Log(level int, msg string) { hostLogString(level, msg) }

// state is reused across calls so that an evaluation allocates little.
var (
	in     abi.Input
	out    abi.Output
	outBuf []byte
	dec    abi.Decoder
	// For batches: the items of the input, and the batch of outputs.
	items    [][]byte
	batchBuf []byte
)

func doInit(config []byte) (err error) {
	defer recoverInto(&err)
	if registered.Evaluate == nil {
		return errors.New("sdk: no module registered (call sdk.Run from init)")
	}
	if registered.Init != nil {
		return registered.Init(config)
	}
	return nil
}

// evaluate decodes an input, runs the module and returns the encoded
// output, or nil on failure.
func evaluate(b []byte) []byte {
	res, err := appendEvaluation(outBuf[:0], b)
	if err != nil {
		hostLogString(Error, err.Error())
		return nil
	}
	outBuf = res
	return res
}

// evaluateBatch evaluates every input of a batch (ABI 1.1) and returns the
// batch of outputs, with an empty item for each input the module failed
// on; nil when the batch itself does not decode.
func evaluateBatch(b []byte) []byte {
	var err error
	if items, err = abi.SplitBatch(items, b, -1); err != nil {
		hostLogString(Error, err.Error())
		return nil
	}
	batchBuf = abi.AppendBatchHeader(batchBuf[:0], len(items))
	for _, it := range items {
		at := len(batchBuf)
		batchBuf = append(batchBuf, 0, 0, 0, 0) // the item's length, set below
		res, err := appendEvaluation(batchBuf, it)
		if err != nil {
			hostLogString(Error, err.Error())
			continue // an empty item: this input failed, the others stand
		}
		n := len(res) - at - 4
		res[at], res[at+1], res[at+2], res[at+3] = byte(n), byte(n>>8), byte(n>>16), byte(n>>24)
		batchBuf = res
	}
	return batchBuf
}

// appendEvaluation decodes input b, runs the module and appends the
// encoded output to dst.
func appendEvaluation(dst, b []byte) (res []byte, err error) {
	defer recoverInto(&err)
	if registered.Evaluate == nil {
		return nil, errors.New("sdk: no module registered")
	}
	if err := dec.DecodeInput(b, &in); err != nil {
		return nil, err
	}
	out.Weights = out.Weights[:0]
	for i := range in.Endpoints {
		out.Weights = append(out.Weights, in.Endpoints[i].Weight)
	}
	out.Scheduler, out.SchedulerFlags, out.Reason = "", nil, ""
	if err := registered.Evaluate(&in, &out); err != nil {
		return nil, err
	}
	res = abi.AppendOutput(dst, &out)
	// Yield now and then: the guest's garbage collector runs its
	// background workers only when this goroutine yields, which an
	// exported function otherwise never does, so a started cycle would
	// keep write barriers on across many calls (RATIONALE.md, "What a
	// guest call costs").
	if calls++; calls%64 == 0 {
		runtime.Gosched()
	}
	return res, nil
}

var calls int // evaluations so far, for the periodic yield above

func recoverInto(err *error) {
	if r := recover(); r != nil {
		*err = errors.New("sdk: module panicked: " + panicMessage(r))
	}
}

// panicMessage describes a recovered panic value without fmt.
func panicMessage(r any) string {
	switch v := r.(type) {
	case error:
		return v.Error()
	case string:
		return v
	case interface{ String() string }:
		return v.String()
	}
	return "a value that is not an error or a string"
}

// Call runs the registered module on in the way the host would, through
// the encoding, and returns its output. For unit tests of a module on the
// build machine; config is passed to Init first when not nil.
func Call(config []byte, input *Input) (*Output, error) {
	if config != nil {
		if err := doInit(config); err != nil {
			return nil, err
		}
	}
	res, err := appendEvaluation(nil, abi.AppendInput(nil, input))
	if err != nil {
		return nil, err
	}
	var o abi.Output
	if err := abi.DecodeOutput(res, &o); err != nil {
		return nil, err
	}
	return &o, o.Validate(len(input.Endpoints))
}

// Lookup returns the value of key in a list of labels or annotations.
func Lookup(kvs []KV, key string) (string, bool) { return abi.Lookup(kvs, key) }
