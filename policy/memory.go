package policy

import "github.com/tetratelabs/wazero/experimental"

// memoryAllocator gives every instance its linear memory (see
// allocateMemory).
var memoryAllocator = experimental.MemoryAllocatorFunc(allocateMemory)

// sliceMemory is a linear memory in a Go slice, grown by copying: the
// fallback when a mapping cannot be made.
type sliceMemory struct{ b []byte }

func (m *sliceMemory) Reallocate(size uint64) []byte {
	if size > uint64(cap(m.b)) {
		m.b = append(m.b[:cap(m.b)], make([]byte, size-uint64(cap(m.b)))...)
	}
	m.b = m.b[:size]
	return m.b
}

func (m *sliceMemory) Free() { m.b = nil }
