package kubeproxy_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/edgeproxy/edgeproxy/datapath/kubeproxy"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// TestRemoveKernel loads a node's kube-proxy rules, kubelet's chains, a
// CNI chain and edgeproxy's own into a namespace under each iptables
// backend, and an nftables-mode kube-proxy table, then removes
// kube-proxy's: what is not kube-proxy's stays, rule for rule.
func TestRemoveKernel(t *testing.T) {
	gate.Root(t)
	rules, err := os.ReadFile("testdata/kube-proxy.rules")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"legacy", "nft"} {
		t.Run(v, func(t *testing.T) {
			gate.Binaries(t, "iptables-"+v+"-restore", "iptables-"+v+"-save", "nft")
			ns := netns.New(t, "kp-"+v)
			ctx := context.Background()
			restore := func(text string) {
				t.Helper()
				if err := ns.Do(func() error {
					cmd := exec.Command("iptables-"+v+"-restore", "--noflush")
					cmd.Stdin = strings.NewReader(text)
					out, err := cmd.CombinedOutput()
					if err != nil {
						t.Fatalf("restore: %v: %s", err, out)
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			restore(string(rules))
			if _, err := ns.Run("nft", "add table ip kube-proxy; add chain ip kube-proxy services; add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }; add rule ip kube-proxy nat-prerouting jump services; add table ip6 kube-proxy; add chain ip6 kube-proxy services"); err != nil {
				t.Fatal(err)
			}
			before := save(t, ns, v)

			var found, removed kubeproxy.Report
			if err := ns.Do(func() error {
				var err error
				if found, err = kubeproxy.Find(ctx, kubeproxy.Options{}); err != nil {
					return err
				}
				removed, err = kubeproxy.Remove(ctx, kubeproxy.Options{})
				return err
			}); err != nil {
				t.Fatal(err)
			}
			t.Logf("removed: %s", removed)
			if found.String() != removed.String() {
				t.Errorf("Find said %s, Remove removed %s", found, removed)
			}
			// nat: 7 chains, 3 jumps; filter: 6, 9; mangle: 1; nft: 2+1 chains.
			if c, j := removed.Chains(), removed.Jumps(); c != 7+6+1+2+1 || j != 12 {
				t.Errorf("removed %d chains and %d jumps, want 17 and 12: %s", c, j, removed)
			}
			after := save(t, ns, v)
			for _, l := range strings.Split(after, "\n") {
				if strings.Contains(l, "kubernetes") || strings.Contains(l, "KUBE-SVC") || strings.Contains(l, "KUBE-SERVICES") ||
					strings.Contains(l, "KUBE-PROXY-") || strings.Contains(l, "KUBE-POSTROUTING") {
					t.Errorf("left after Remove: %s", l)
				}
			}
			// Everything that is not kube-proxy's is still there.
			for _, keep := range []string{
				"-A INPUT -j KUBE-FIREWALL", "-A OUTPUT -j KUBE-FIREWALL", ":KUBE-FIREWALL",
				"block incoming localnet connections", ":KUBE-KUBELET-CANARY", ":KUBE-IPTABLES-HINT",
				"-A PREROUTING -j EP-SERVICES", "-A POSTROUTING -j CNI-HOSTPORT-MASQ",
				"-A CNI-HOSTPORT-MASQ -j KUBE-MARK-MASQ", "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000",
			} {
				if !strings.Contains(before, keep) {
					t.Fatalf("test setup: %q not loaded", keep)
				}
				if !strings.Contains(after, keep) {
					t.Errorf("Remove took %q", keep)
				}
			}
			if out, err := ns.Run("nft", "list", "tables"); err != nil || strings.Contains(out, "kube-proxy") {
				t.Errorf("nft tables after Remove: %s %v", out, err)
			}
			// A second pass finds nothing more to remove but the kept chain.
			if err := ns.Do(func() error {
				again, err := kubeproxy.Find(ctx, kubeproxy.Options{})
				if err == nil && (again.Chains() != 0 || again.Jumps() != 0) {
					t.Errorf("found after Remove: %s", again)
				}
				return err
			}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func save(t *testing.T, ns *netns.NS, v string) string {
	t.Helper()
	out, err := ns.Run("iptables-" + v + "-save")
	if err != nil {
		t.Fatal(err)
	}
	return out
}
