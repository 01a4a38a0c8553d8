// Command forbidden is a hostile policy module for the tests: it imports path_open and sock_accept, reaching for files and sockets.
//
// It misbehaves on every call unless its config says {"only": "NS"}, in
// which case it behaves (passes the weights through) except for services
// in namespace NS — so the same module shows both a refusal at check time
// and containment at run time.
package main

import (
	"unsafe"

	"github.com/edgeproxy/edgeproxy/modules/sdk"
)

var cfg struct {
	Only string `json:"only"`
}

func init() { sdk.Run(sdk.Module{Init: sdk.JSON(&cfg), Evaluate: evaluate}) }

func evaluate(in *sdk.Input, out *sdk.Output) error {
	if cfg.Only != "" && in.Service.Namespace != cfg.Only {
		return nil
	}
	var fd int32
	sink = pathOpen(3, 0, nil, 0, 0, 0, 0, 0, &fd) + sockAccept(3, 0, &fd)
	return nil
}

var sink int32

//go:wasmimport wasi_snapshot_preview1 path_open
func pathOpen(dirfd int32, dirflags uint32, path unsafe.Pointer, pathLen uint32, oflags uint32, rightsBase uint64, rightsInheriting uint64, fdflags uint32, fd *int32) int32

//go:wasmimport wasi_snapshot_preview1 sock_accept
func sockAccept(fd int32, flags uint32, newfd *int32) int32

func main() {}
