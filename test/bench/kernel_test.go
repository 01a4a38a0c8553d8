package bench

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
)

// The ground-truth readers see exactly the DNAT destinations a restore
// wrote, in each backend, whatever chain they are in.
func TestKernelReaders(t *testing.T) {
	gate.Root(t)
	gate.Binaries(t, "iptables-legacy-restore", "iptables-nft-restore", "ip")
	for _, backend := range []string{"legacy", "nft"} {
		t.Run(backend, func(t *testing.T) {
			ns, err := NewNetns("kernel-" + backend)
			if err != nil {
				t.Fatal(err)
			}
			defer ns.Close()
			k, err := ns.OpenKernel(backend)
			if err != nil {
				t.Fatal(err)
			}
			defer k.Close()
			if got := scanAll(t, k); len(got) != 0 {
				t.Fatalf("empty namespace: got %v", got)
			}
			var want []string
			var b strings.Builder
			b.WriteString("*nat\n:A - [0:0]\n:B - [0:0]\n-A PREROUTING -d 10.96.0.1/32 -p tcp --dport 80 -j A\n")
			for i := range 3 {
				d := fmt.Sprintf("10.128.0.%d:%d", i+1, 8080+i)
				want = append(want, d)
				fmt.Fprintf(&b, "-A A -p tcp -m statistic --mode random --probability 0.5 -j DNAT --to-destination %s\n", d)
			}
			b.WriteString("-A B -p udp -j DNAT --to-destination 10.128.1.1:53\n-A B -j MASQUERADE\nCOMMIT\n")
			want = append(want, "10.128.1.1:53")
			w, ctx := startWatcher(t, k)
			first := DestOf(netip.MustParseAddrPort("10.128.0.1:8080"))
			if w.Has(first) {
				t.Fatal("the watcher sees a rule before it is written")
			}
			cmd := ns.Command("iptables-" + backend + "-restore")
			cmd.Stdin = strings.NewReader(b.String())
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("restore: %v: %s", err, out)
			}
			if _, err := w.WaitFlip(ctx, first, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			got := scanAll(t, k)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("DNAT destinations = %v, want %v", got, want)
			}
			g1, err := k.Generation()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ns.Run("iptables-"+backend, "-t", "nat", "-F", "B"); err != nil {
				t.Fatal(err)
			}
			g2, _ := k.Generation()
			if g1 == g2 {
				t.Fatalf("generation did not change across a write (%d)", g1)
			}
			if got := scanAll(t, k); len(got) != 3 {
				t.Fatalf("after flushing B: %v", got)
			}
			// The watcher follows deletions too.
			udp := DestOf(netip.MustParseAddrPort("10.128.1.1:53"))
			for w.Has(udp) {
				if _, err := w.Poll(ctx); err != nil {
					t.Fatalf("the flushed rule stays in the watcher's view: %v", err)
				}
			}
			if !w.Has(first) {
				t.Fatal("a rule that stayed left the watcher's view")
			}
		})
	}
}

// startWatcher watches k for the test (30s at most), past its first read.
func startWatcher(t *testing.T, k Kernel) (*Watcher, context.Context) {
	t.Helper()
	w := NewWatcher(k)
	t.Cleanup(w.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	if _, err := w.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	return w, ctx
}

func scanAll(t *testing.T, k Kernel) []string {
	t.Helper()
	var out []string
	if err := k.Scan(func(d Dest) { out = append(out, d.String()) }); err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

func TestDestOf(t *testing.T) {
	ap := netip.MustParseAddrPort("10.128.3.4:8080")
	if got := DestOf(ap).String(); got != ap.String() {
		t.Fatalf("round trip: %s", got)
	}
}
