package abi_test

import (
	"bytes"
	"slices"
	"testing"

	"github.com/edgeproxy/edgeproxy/policy/abi"
)

func TestBatchRoundTrip(t *testing.T) {
	items := [][]byte{abi.AppendInput(nil, sample()), {}, []byte("x")}
	b := abi.AppendBatchHeader(nil, len(items))
	for _, it := range items {
		b = abi.AppendBatchItem(b, it)
	}
	got, err := abi.SplitBatch(nil, b, len(items))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(got, items, bytes.Equal) {
		t.Fatalf("SplitBatch = %q, want %q", got, items)
	}
	if _, err := abi.SplitBatch(nil, b, 2); err == nil {
		t.Error("a batch of 3 accepted where 2 were expected")
	}
	for _, bad := range [][]byte{
		b[:len(b)-1],                         // truncated item
		append(slices.Clone(b), 0),           // trailing byte
		{2, 0, 0, 0, 0, 0, 0, 0},             // version
		{1, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f}, // count past the bytes
		abi.AppendBatchHeader(nil, abi.MaxBatchCount+1),
	} {
		if _, err := abi.SplitBatch(nil, bad, -1); err == nil {
			t.Errorf("SplitBatch(%x) accepted", bad)
		}
	}
}

// FuzzSplitBatch: no framing panics, and whatever splits re-frames to the
// same bytes.
func FuzzSplitBatch(f *testing.F) {
	f.Add(abi.AppendBatchItem(abi.AppendBatchHeader(nil, 1), abi.AppendInput(nil, sample())))
	f.Add(abi.AppendBatchHeader(nil, 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		items, err := abi.SplitBatch(nil, b, -1)
		if err != nil {
			return
		}
		again := abi.AppendBatchHeader(nil, len(items))
		for _, it := range items {
			again = abi.AppendBatchItem(again, it)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("re-framed %x, want %x", again, b)
		}
	})
}
