//go:build !linux

package policy

import "github.com/tetratelabs/wazero/experimental"

func allocateMemory(capacity, max uint64) experimental.LinearMemory { return &sliceMemory{} }
