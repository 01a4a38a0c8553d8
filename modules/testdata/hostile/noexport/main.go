// Command noexport is a hostile policy module for the tests: it has no ep_evaluate export.
// It does not use the SDK, so that its exports are exactly what is written
// here.
package main

import "unsafe"

var buf []byte

//go:wasmexport edgeproxy_abi_v1
func marker() {}

//go:wasmexport ep_alloc
func alloc(n int32) int32 {
	buf = make([]byte, max(n, 1))
	return int32(uintptr(unsafe.Pointer(&buf[0])))
}

//go:wasmexport ep_init
func initModule(ptr, n int32) int32 { return 0 }

func main() {}
