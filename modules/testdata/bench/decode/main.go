// Command decode measures, inside the guest, what decoding one input costs
// in the ABI's binary encoding and in JSON (RATIONALE.md, "Why a binary
// encoding?"). It is not a policy module: the policy benchmarks call its
// exports through wazero directly.
package main

import (
	"encoding/json"
	"unsafe"

	"github.com/edgeproxy/edgeproxy/policy/abi"
)

var (
	buf []byte
	in  abi.Input
	dec abi.Decoder
)

//go:wasmexport noop
func noop(n int32) int32 { return n }

// decodeAliasing is decodeBinary with the SDK's decoder (one copy, strings alias it).
//
//go:wasmexport decode_aliasing
func decodeAliasing(n int32) int32 {
	for range n {
		if err := dec.DecodeInput(buf, &in); err != nil {
			return -1
		}
	}
	return int32(len(in.Endpoints))
}

//go:wasmexport alloc
func alloc(n int32) int32 {
	buf = make([]byte, n)
	return int32(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
}

// decodeBinary decodes the binary input in buf n times; returns the
// endpoint count, or -1 on error.
//
//go:wasmexport decode_binary
func decodeBinary(n int32) int32 {
	for range n {
		if err := abi.DecodeInput(buf, &in); err != nil {
			return -1
		}
	}
	return int32(len(in.Endpoints))
}

// decodeJSON decodes the JSON input in buf n times.
//
//go:wasmexport decode_json
func decodeJSON(n int32) int32 {
	for range n {
		in.Endpoints = in.Endpoints[:0] // reuse, as the binary decoder does
		if err := json.Unmarshal(buf, &in); err != nil {
			return -1
		}
	}
	return int32(len(in.Endpoints))
}

func main() {}
