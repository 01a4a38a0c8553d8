package policy

import (
	"syscall"

	"github.com/tetratelabs/wazero/experimental"
)

// mmapMemory backs a guest's linear memory with one anonymous mapping of
// its maximum size, made once at instantiation and unmapped when the
// instance closes. Growing the memory is then only a longer slice of the
// same mapping: wazero's default, a Go slice appended to, copies the whole
// memory at each growth, and a Go guest grows its memory many times while
// its runtime starts — that copying was most of an instantiation's time
// (RATIONALE.md, "What a module costs at start-up"). Pages the guest never
// touches cost no RAM (MAP_NORESERVE), fresh pages read as zero as wasm
// requires, and the memory lives outside the host's Go heap, so it neither
// adds to the garbage collector's work nor has to be zeroed on reuse.
//
// The mapping is gone once wazero frees it (the instance or the Host
// closed): the Instance touches guest memory only while its wasm module
// is open (see Instance.write).
type mmapMemory struct{ b []byte }

// mmapMax bounds the mapping: a larger memory (an Options.MemoryLimit
// above 1 GiB) is a Go slice.
const mmapMax = 1 << 30

// allocateMemory is the experimental.MemoryAllocator of every instance.
func allocateMemory(capacity, max uint64) experimental.LinearMemory {
	if max == 0 || max > mmapMax {
		return &sliceMemory{}
	}
	b, err := syscall.Mmap(-1, 0, int(max), syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS|syscall.MAP_NORESERVE)
	if err != nil {
		return &sliceMemory{}
	}
	return &mmapMemory{b: b}
}

// Reallocate returns the first size bytes of the mapping; nil (the guest's
// memory.grow fails) past its end.
func (m *mmapMemory) Reallocate(size uint64) []byte {
	if m.b == nil || size > uint64(len(m.b)) {
		return nil
	}
	return m.b[:size:size]
}

func (m *mmapMemory) Free() {
	if m.b != nil {
		_ = syscall.Munmap(m.b)
		m.b = nil
	}
}
