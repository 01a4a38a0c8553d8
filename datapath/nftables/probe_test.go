package nftables

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// This kernel has everything the datapath writes: the probe passes and
// leaves no table behind.
func TestProbe(t *testing.T) {
	kernel(t)
	ns := netns.New(t, "nftprobe")
	p := newProxier(t, ns, Options{IPv6: true})
	if err := p.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	if out := list(t, ns, "tables"); strings.TrimSpace(out) != "" {
		t.Errorf("the probe left tables:\n%s", out)
	}
}

// A part the kernel refuses is named, alone: here a numgen expression
// whose modulus the kernel rejects (ERANGE) stands for an expression the
// kernel lacks. Nothing is left behind.
func TestProbeNamesWhatIsRefused(t *testing.T) {
	kernel(t)
	ns := netns.New(t, "nftprobe")
	p := newProxier(t, ns, Options{IPv6: true})
	err := p.probe(context.Background(), func(f *fam) []feature {
		bad := feature{"numgen with modulus 0 (refused)", rule{text: "numgen random mod 0", exprs: []expr.Any{
			&expr.Numgen{Register: reg1, Modulus: 0, Type: unix.NFT_NG_RANDOM},
		}}}
		return append(f.features(1<<14), bad)
	})
	if !errors.Is(err, ErrKernelSupport) || !strings.Contains(err.Error(), "numgen with modulus 0 (refused) (`numgen random mod 0`)") {
		t.Fatalf("probe error %v, want ErrKernelSupport naming the refused rule", err)
	}
	if strings.Contains(err.Error(), "dnat") || strings.Contains(err.Error(), "set ") || !strings.Contains(err.Error(), "ip table") {
		t.Errorf("probe error names more than the refused rule, or no family: %v", err)
	}
	if out := list(t, ns, "tables"); strings.TrimSpace(out) != "" {
		t.Errorf("the probe left tables:\n%s", out)
	}
}
