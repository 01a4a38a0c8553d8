package vm_test

import (
	"cmp"
	"os"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/vm"
)

// guestPackages are the packages whose kernel tests need the VM (IPVS,
// dummy links, SCTP). They all run in one boot. Of datapath/iptables and
// datapath/nftables only the SCTP test, of datapath/kubeproxy only the
// IPVS one: their other kernel tests run on the host.
var guestPackages = []vm.GoTest{
	{Package: "./datapath/ipvs"},
	{Package: "./datapath/ipset"},
	{Package: "./datapath/iptables", Args: []string{"-test.run=SCTP"}},
	{Package: "./datapath/nftables", Args: []string{"-test.run=SCTP"}},
	// What kube-proxy's IPVS mode leaves, found and removed.
	{Package: "./datapath/kubeproxy", Args: []string{"-test.run=IPVS"}},
}

// TestGuestPackages runs the guest-only tests of guestPackages in one VM.
func TestGuestPackages(t *testing.T) {
	vm.RunGoTests(t, 14*time.Minute, guestPackages...)
}

// TestGuestBenchmarks runs the datapath benchmarks in the VM. They take
// minutes under TCG, so they are opt-in: EDGEPROXY_VM_BENCH=1;
// EDGEPROXY_VM_BENCH_RUN picks benchmarks as -bench does (default all,
// e.g. 'Apply/(ipv4|dual)/services=1000').
func TestGuestBenchmarks(t *testing.T) {
	if os.Getenv("EDGEPROXY_VM_BENCH") != "1" {
		t.Skip("opt-in: set EDGEPROXY_VM_BENCH=1")
	}
	bench := cmp.Or(os.Getenv("EDGEPROXY_VM_BENCH_RUN"), ".")
	vm.RunGoTests(t, 30*time.Minute, vm.GoTest{Package: "./datapath/ipvs", Args: []string{"-test.run=^$", "-test.bench=" + bench, "-test.benchtime=1x"}})
}
