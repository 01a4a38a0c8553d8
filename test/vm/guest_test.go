package vm_test

import (
	"os"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/vm"
)

// guestPackages are the packages whose kernel tests need the VM (IPVS,
// dummy links). They all run in one boot.
var guestPackages = []vm.GoTest{
	{Package: "./datapath/ipvs"},
	{Package: "./datapath/ipset"},
}

// TestGuestPackages runs the guest-only tests of guestPackages in one VM.
func TestGuestPackages(t *testing.T) {
	vm.RunGoTests(t, 14*time.Minute, guestPackages...)
}

// TestGuestBenchmarks runs the datapath benchmarks in the VM. They take
// minutes under TCG, so they are opt-in: EDGEPROXY_VM_BENCH=1.
func TestGuestBenchmarks(t *testing.T) {
	if os.Getenv("EDGEPROXY_VM_BENCH") != "1" {
		t.Skip("opt-in: set EDGEPROXY_VM_BENCH=1")
	}
	vm.RunGoTests(t, 30*time.Minute, vm.GoTest{Package: "./datapath/ipvs", Args: []string{"-test.run=^$", "-test.bench=.", "-test.benchtime=1x"}})
}
