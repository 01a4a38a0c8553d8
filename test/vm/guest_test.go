package vm

import (
	"testing"
	"time"
)

// guestPackages are the packages whose kernel tests need the VM (IPVS,
// dummy links). They all run in one boot.
var guestPackages = []GoTest{
	{Package: "./datapath/ipvs"},
	{Package: "./datapath/ipset"},
}

// TestGuestPackages runs the guest-only tests of guestPackages in one VM.
func TestGuestPackages(t *testing.T) {
	RunGoTests(t, 9*time.Minute, guestPackages...)
}
