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

// The failing line is found in each backend's wording, and only there.
func TestFailedLine(t *testing.T) {
	for msg, want := range map[string]int{
		"iptables-restore: line 12 failed":                                                                                 12,
		"iptables-restore v1.8.9 (nf_tables): line 7: RULE_APPEND failed (No such file)":                                   7,
		"iptables-restore v1.8.9 (legacy): Couldn't load match `x'\nError occurred at line: 31\nTry `iptables-restore -h'": 31,
		"exit status 2: no line number here":                                                                               0,
		"pipeline broken":                                                                                                  0,
	} {
		if got := failedLine(msg); got != want {
			t.Errorf("failedLine(%q) = %d, want %d", msg, got, want)
		}
	}
}
