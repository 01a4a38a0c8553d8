// Command forbidden is a hostile policy module for the tests: it imports path_open and sock_accept, reaching for files and sockets.
// It misbehaves as package misbehave says (all calls, or those of one namespace).
package main

import (
	"unsafe"

	"github.com/edgeproxy/edgeproxy/modules/sdk"
	"github.com/edgeproxy/edgeproxy/modules/testdata/hostile/misbehave"
)

func init() { misbehave.Run(evaluate) }

func evaluate(_ *sdk.Input, _ *sdk.Output) {
	var fd int32
	sink = pathOpen(3, 0, nil, 0, 0, 0, 0, 0, &fd) + sockAccept(3, 0, &fd)
}

var sink int32

//go:wasmimport wasi_snapshot_preview1 path_open
func pathOpen(dirfd int32, dirflags uint32, path unsafe.Pointer, pathLen uint32, oflags uint32, rightsBase uint64, rightsInheriting uint64, fdflags uint32, fd *int32) int32

//go:wasmimport wasi_snapshot_preview1 sock_accept
func sockAccept(fd int32, flags uint32, newfd *int32) int32

func main() {}
