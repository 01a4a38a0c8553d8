package abi

import (
	"encoding/binary"
	"errors"
)

// Limits of one batch (ABI 1.1). A host never sends more items or bytes
// than these in one ep_evaluate_batch call; it may send fewer.
const (
	MaxBatchCount = 1024
	MaxBatchBytes = 1 << 20
)

// A batch frames several encodings (Inputs one way, Outputs the other):
//
//	u32 version = 1
//	u32 count
//	count × (u32 len, len bytes)
//
// In a batch of Outputs, item k answers input k, and an item of length 0
// reports that the module failed on input k (its batch-mates stand).

// AppendBatchHeader appends a batch header for count items to b.
func AppendBatchHeader(b []byte, count int) []byte {
	b = binary.LittleEndian.AppendUint32(b, Version)
	return binary.LittleEndian.AppendUint32(b, uint32(count))
}

// AppendBatchItem appends one framed item to b.
func AppendBatchItem(b, item []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(item)))
	return append(b, item...)
}

// SplitBatch checks the framing of b and appends its items to dst[:0];
// they alias b. count is the number of items expected, or -1 for any
// number up to MaxBatchCount.
func SplitBatch(dst [][]byte, b []byte, count int) ([][]byte, error) {
	dst = dst[:0]
	if len(b) < 8 {
		return dst, truncated("abi: batch of " + itoa(len(b)) + " bytes")
	}
	if v := binary.LittleEndian.Uint32(b); v != Version {
		return dst, errors.New("abi: batch version " + u32s(v) + ", want " + itoa(Version))
	}
	n := binary.LittleEndian.Uint32(b[4:])
	if count >= 0 && n != uint32(count) {
		return dst, errors.New("abi: batch of " + u32s(n) + " items, want " + itoa(count))
	}
	if n > MaxBatchCount || n > uint32(len(b)-8)/4 {
		return dst, truncated("abi: batch of " + u32s(n) + " items in " + itoa(len(b)) + " bytes")
	}
	p := 8
	for k := range int(n) {
		if len(b)-p < 4 {
			return dst, truncated("abi: batch item " + itoa(k))
		}
		l := int(binary.LittleEndian.Uint32(b[p:]))
		p += 4
		if l > len(b)-p {
			return dst, truncated("abi: batch item " + itoa(k) + " of " + itoa(l) + " bytes")
		}
		dst = append(dst, b[p:p+l:p+l])
		p += l
	}
	if p != len(b) {
		return dst, errors.New("abi: batch: " + itoa(len(b)-p) + " trailing bytes")
	}
	return dst, nil
}
