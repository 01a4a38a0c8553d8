//go:build wasip1

package sdk

import "unsafe"

//go:wasmimport edgeproxy log
func hostLog(level, ptr, n uint32)

func hostLogString(level int, s string) {
	if len(s) == 0 {
		return
	}
	hostLog(uint32(level), uint32(uintptr(unsafe.Pointer(unsafe.StringData(s)))), uint32(len(s)))
}

// inBuf is the buffer ep_alloc hands out; a global so the GC keeps it.
var inBuf []byte

//go:wasmexport edgeproxy_abi_v1
func abiMarker() {}

//go:wasmexport ep_alloc
func epAlloc(n int32) int32 {
	if n <= 0 {
		n = 1
	}
	if cap(inBuf) < int(n) {
		inBuf = make([]byte, n)
	}
	inBuf = inBuf[:n]
	return int32(uintptr(unsafe.Pointer(unsafe.SliceData(inBuf))))
}

//go:wasmexport ep_init
func epInit(ptr, n int32) int32 {
	if n < 0 || int(n) > len(inBuf) {
		return 1
	}
	cfg := make([]byte, n)
	copy(cfg, inBuf)
	if err := doInit(cfg); err != nil {
		hostLogString(Error, err.Error())
		return 1
	}
	return 0
}

//go:wasmexport ep_evaluate
func epEvaluate(ptr, n int32) int64 {
	if n < 0 || int(n) > len(inBuf) {
		return 0
	}
	return packed(evaluate(inBuf[:n]))
}

//go:wasmexport ep_evaluate_batch
func epEvaluateBatch(ptr, n int32) int64 {
	if n < 0 || int(n) > len(inBuf) {
		return 0
	}
	return packed(evaluateBatch(inBuf[:n]))
}

// packed returns ptr<<32 | len of res, 0 for a failure (no res).
func packed(res []byte) int64 {
	if len(res) == 0 {
		return 0
	}
	p := uint32(uintptr(unsafe.Pointer(unsafe.SliceData(res))))
	return int64(uint64(p)<<32 | uint64(len(res)))
}
