package xtables

import (
	"context"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath"
)

func TestBinaries(t *testing.T) {
	for _, c := range []struct {
		v            Variant
		fam          datapath.Family
		ipt, restore string
	}{
		{Auto, datapath.IPv4, "iptables", "iptables-restore"},
		{NFT, datapath.IPv4, "iptables-nft", "iptables-nft-restore"},
		{Legacy, datapath.IPv6, "ip6tables-legacy", "ip6tables-legacy-restore"},
	} {
		ipt, restore := Binaries(c.v, c.fam)
		if ipt != c.ipt || restore != c.restore {
			t.Errorf("Binaries(%q, %d) = %s, %s; want %s, %s", c.v, c.fam, ipt, restore, c.ipt, c.restore)
		}
	}
}

func TestOtherAndWait(t *testing.T) {
	if NFT.Other() != Legacy || Legacy.Other() != NFT {
		t.Errorf("Other: nft -> %q, legacy -> %q", NFT.Other(), Legacy.Other())
	}
	// The lock wait is whole seconds, rounded up: never 0 for a wait > 0.
	for d, want := range map[time.Duration]int{time.Second: 1, 1500 * time.Millisecond: 2, time.Millisecond: 1} {
		if got := (&Tool{Wait: d}).WaitSeconds(); got != want {
			t.Errorf("WaitSeconds(%v) = %d, want %d", d, got, want)
		}
	}
}

// A datapath whose tools were never opened (unit tests with a fake
// kernel) gets errors, not a panic.
func TestNilToolFails(t *testing.T) {
	var x *Tool
	if _, err := x.Run(context.Background(), "-S"); err == nil {
		t.Error("Run on a nil Tool succeeded")
	}
	if err := x.RestoreNoFlush(context.Background(), []byte("COMMIT\n")); err == nil {
		t.Error("RestoreNoFlush on a nil Tool succeeded")
	}
	if _, err := x.SaveTable(context.Background(), "nat"); err == nil {
		t.Error("SaveTable on a nil Tool succeeded")
	}
}
