package fault

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/iptables"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

const podPort = 8080

var vip = netip.MustParseAddr("10.96.0.10")

// The xtables lock held by another program for longer than lockWait: the
// apply fails as a whole (not as a refused service port, so the agent
// retries it with a full sync and /healthz turns unhealthy once the change
// has waited past sync.healthTimeout, see agent TestHealthFollowsPendingChanges);
// the rules already in the kernel keep answering; once the lock is free the
// pending change is programmed.
//
// Only iptables-legacy takes the lock (iptables-nft does not). The lock
// file is the test's own (XTABLES_LOCKFILE), not /run/xtables.lock, which
// every network namespace on the machine shares.
func TestXtablesLockHeld(t *testing.T) {
	gate.Root(t)
	gate.Binaries(t, "iptables-legacy", "iptables-legacy-restore", "iptables-legacy-save")
	lockFile := filepath.Join(t.TempDir(), "xtables.lock")
	t.Setenv("XTABLES_LOCKFILE", lockFile)

	node := netns.NewNode(t, "node")
	client := node.AddClient("client")
	a, b := node.AddPod("a"), node.AddPod("b")
	for _, p := range []*netns.Pod{a, b} {
		if err := p.Serve(podPort); err != nil {
			t.Fatal(err)
		}
	}
	var p *iptables.Proxier
	if err := node.Do(func() (err error) {
		p, err = iptables.New(iptables.Options{Variant: iptables.Legacy, MasqueradeBit: 14, NoConntrack: true, LockWait: time.Second})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	apply := func(to *netns.Pod) error {
		plan := &datapath.Plan{Full: true, Changed: map[datapath.ServicePortName]bool{{Namespace: "t", Name: "web", Port: "http"}: true}, Frontends: []datapath.Frontend{{
			Service: datapath.ServicePortName{Namespace: "t", Name: "web", Port: "http"}, Kind: datapath.ClusterIP, Protocol: datapath.TCP, Addr: vip, Family: datapath.IPv4, Port: 80,
			Endpoints: []datapath.Endpoint{{Addr: to.AddrPort(podPort), Weight: 1, Local: true}},
		}}}
		return node.Do(func() error { return p.Apply(context.Background(), plan) })
	}
	answeredBy := func(want string) {
		t.Helper()
		r, err := client.TCP(netip.AddrPortFrom(vip, 80), 2*time.Second)
		if err != nil || r.Name != want {
			t.Fatalf("the Service answered %q (err %v), want pod %s", r.Name, err, want)
		}
	}
	if err := apply(a); err != nil {
		t.Fatal(err)
	}
	answeredBy("a")

	lock, err := os.OpenFile(lockFile, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the agent retries; each try fails the same way
		err := apply(b)
		if err == nil {
			t.Fatal("an apply succeeded while the xtables lock was held")
		}
		if ports, rest := datapath.SplitPortErrors(err); rest == nil {
			t.Fatalf("a held lock came back as refused service ports %v; want a failed apply", ports)
		}
		answeredBy("a") // the rules in the kernel are intact
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	if err := apply(b); err != nil {
		t.Fatalf("apply after the lock was released: %v", err)
	}
	answeredBy("b")
}
