package agent

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/datapath"
)

// watched is a datapath whose kernel objects are unchanged while told so
// (the iptables datapath reads its tables' fingerprint; see
// datapath/iptables TestUnchangedFollowsTheKernel for the real kernel).
type watched struct {
	flaky
	unchanged atomic.Bool
}

func (w *watched) Unchanged() bool { return w.unchanged.Load() }

// dueCompare makes the periodic compare due at the next sync, and pokes it.
func dueCompare(a *Agent) {
	a.mu.Lock()
	a.lastFull = time.Now().Add(-2 * a.Config().Sync.Period)
	a.mu.Unlock()
	a.runner.Run()
}

// A periodic compare on a quiet node, state and kernel unmoved, plans and
// applies nothing; once the kernel moved, the next one compares in full.
func TestQuietPeriodicCompare(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(webManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	b := &watched{}
	b.unchanged.Store(true)
	a := startAgent(t, b, dir)
	<-a.Synced()
	// The first apply was full; the compare that follows it a quiet one.
	n := len(b.got())
	a.metrics.lastSync.Set(0)
	for i := range 3 {
		dueCompare(a)
		eventually(t, "a quiet compare", func() bool { return testutil.ToFloat64(a.metrics.quietCompares) == float64(i+1) })
	}
	if got := len(b.got()); got != n {
		t.Fatalf("quiet compares applied %d plans", got-n)
	}
	if ts := testutil.ToFloat64(a.metrics.lastSync); ts == 0 {
		t.Errorf("last sync timestamp %v not kept current by quiet syncs", ts)
	}

	b.unchanged.Store(false) // a foreign write to the tables
	dueCompare(a)
	eventually(t, "a full compare", func() bool { return len(b.got()) > n })
	if p := b.got()[n]; !p.Full || testutil.ToFloat64(a.metrics.quietCompares) != 3 {
		t.Fatalf("after a kernel write: plan full=%v, quiet compares %v; want a full plan", p.Full, testutil.ToFloat64(a.metrics.quietCompares))
	}
}

// After a quiet compare the sync loop rests: no run per sync.period until
// something moves. A change is still synced at once, and the loop is back
// on sync.period until its compare has been done; a kernel that cannot
// vouch for its objects keeps every period's compare.
func TestQuietNodeRests(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(webManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	const period = 50 * time.Millisecond
	b := &watched{}
	b.unchanged.Store(true)
	a := startAgent(t, b, dir)
	<-a.Synced()
	runs := func() uint64 { return a.runner.Status().Runs }
	// The first sync (a full one) rested; once it has ended, a period
	// from now on and a compare due at its end.
	eventually(t, "the first sync's end", func() bool { return runs() >= 1 })
	cfg := *a.Config()
	cfg.Sync.Period = period
	a.cfg.Store(&cfg)
	a.runner.SetIntervals(cfg.Sync.MinPeriod, cfg.Sync.MinPeriod, period)
	quiet := func() float64 { return testutil.ToFloat64(a.metrics.quietCompares) }

	eventually(t, "a quiet compare", func() bool { return quiet() >= 1 })
	at := runs()
	time.Sleep(20 * period)
	if got := runs(); got != at {
		t.Fatalf("%d syncs in %v after a quiet compare; want none (the loop rests)", got-at, 20*period)
	}

	n := len(b.got())
	a.state.SetService("t/api", &model.Service{Namespace: "t", Name: "api",
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.6")}, Ports: []model.ServicePort{{Protocol: "TCP", Port: 80}}})
	eventually(t, "the change's plan", func() bool { return len(b.got()) > n })
	eventually(t, "the compare after the change", func() bool { return len(b.got()) > n+1 })
	if p := b.got()[n+1]; !p.Full {
		t.Fatalf("the periodic run after the change planned full=%v; want the compare", p.Full)
	}
	// That compare was the guard: the loop rests after it.
	at = runs()
	time.Sleep(20 * period)
	if got := runs(); got != at {
		t.Fatalf("%d syncs in %v after the compare that followed a change; want none", got-at, 20*period)
	}

	// A kernel that cannot vouch: every period compares again.
	b.unchanged.Store(false)
	a.runner.Run()
	eventually(t, "syncs every period", func() bool { return len(b.got()) > n+4 })
}

// A change that arrives when the compare is due is applied first, as a
// partial plan, and asks for no sync of its own (which would hold the next
// change for sync.minPeriod after it); the compare comes with the next
// sync, here the next change's, which applies that change on its own
// before it compares (the compare renders every service again).
func TestChangeDoesNotWaitForCompare(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(webManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	b := &watched{} // the kernel cannot vouch: every compare is a full one
	a := startAgent(t, b, dir)
	<-a.Synced()
	n := len(b.got())
	a.mu.Lock()
	a.lastFull = time.Now().Add(-2 * a.Config().Sync.Period)
	a.mu.Unlock()
	a.state.SetService("t/api", &model.Service{Namespace: "t", Name: "api",
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.6")}, Ports: []model.ServicePort{{Protocol: "TCP", Port: 80}}})
	eventually(t, "the change's plan", func() bool { return len(b.got()) >= n+1 })
	change := b.got()[n]
	api := datapath.ServicePortName{Namespace: "t", Name: "api"}
	if change.Full || !change.Changed[api] || !hasService(change, api) {
		t.Fatalf("the change came in plan full=%v changed=%v; want a partial plan with t/api:", change.Full, change.Changed)
	}
	time.Sleep(50 * a.Config().Sync.MinPeriod) // time for a sync of its own, were one asked for
	if got := len(b.got()); got != n+1 {
		t.Fatalf("%d more plans after the change without another change; want none", got-n-1)
	}
	a.state.SetService("t/db", &model.Service{Namespace: "t", Name: "db",
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.7")}, Ports: []model.ServicePort{{Protocol: "TCP", Port: 5432}}})
	eventually(t, "the next change's plans", func() bool { return len(b.got()) >= n+3 })
	db := datapath.ServicePortName{Namespace: "t", Name: "db"}
	if next := b.got()[n+1]; next.Full || !next.Changed[db] || !hasService(next, db) {
		t.Fatalf("the next change came in plan full=%v changed=%v; want a partial plan with t/db: first", next.Full, next.Changed)
	}
	if cmp := b.got()[n+2]; !cmp.Full || !hasService(cmp, db) {
		t.Fatalf("the plan after the next change's was full=%v; want the compare, with t/db:", cmp.Full)
	}
	time.Sleep(50 * a.Config().Sync.MinPeriod)
	if got := len(b.got()); got != n+3 {
		t.Fatalf("%d more plans after the compare without another change; want none", got-n-3)
	}
}

func hasService(p *datapath.Plan, svc datapath.ServicePortName) bool {
	for _, f := range p.Frontends {
		if f.Service == svc {
			return true
		}
	}
	return false
}

// monitored is a datapath whose tamper checks are counted, and which
// announces writes to its kernel objects when watch is set (as the
// iptables datapath does on iptables-nft).
type monitored struct {
	flaky
	checks atomic.Int32
	watch  chan struct{} // nil: no watch (datapath.ErrNoWatch)
}

func (m *monitored) Tampered(context.Context) (bool, error) { m.checks.Add(1); return false, nil }

func (m *monitored) WatchWrites(ctx context.Context, written chan<- struct{}) error {
	if m.watch == nil {
		return datapath.ErrNoWatch
	}
	written <- struct{}{} // watching from now on
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-m.watch:
			select {
			case written <- struct{}{}:
			default:
			}
		}
	}
}

// A monitor whose datapath announces writes looks for tampering only after
// one (on the next tick); without announcements it looks every tick.
func TestMonitorWaitsForWrites(t *testing.T) {
	old := tamperCheckEvery
	tamperCheckEvery = 20 * time.Millisecond
	t.Cleanup(func() { tamperCheckEvery = old })
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(webManifest), 0o644); err != nil {
		t.Fatal(err)
	}

	t.Run("watched", func(t *testing.T) {
		b := &monitored{watch: make(chan struct{})}
		a := startAgent(t, b, dir)
		<-a.Synced()
		// The first look, once the watch is on; then none while quiet.
		eventually(t, "the first look", func() bool { return b.checks.Load() == 1 })
		time.Sleep(20 * tamperCheckEvery)
		if n := b.checks.Load(); n != 1 {
			t.Fatalf("%d looks on a quiet node; want 1", n)
		}
		for range 3 { // a burst of writes: one look (two if the test is slow)
			b.watch <- struct{}{}
		}
		eventually(t, "a look after the writes", func() bool { return b.checks.Load() >= 2 })
		time.Sleep(10 * tamperCheckEvery)
		if n := b.checks.Load(); n > 3 {
			t.Fatalf("%d looks after one burst of writes; want 2", n)
		}
	})
	t.Run("polled", func(t *testing.T) {
		b := &monitored{}
		a := startAgent(t, b, dir)
		<-a.Synced()
		eventually(t, "a look every tick", func() bool { return b.checks.Load() >= 5 })
	})
}

// The tamper monitor wakes on multiples of its period on the wall clock.
func TestUntilTick(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct{ now, want time.Duration }{
		{0, 10 * time.Second},
		{time.Millisecond, 10*time.Second - time.Millisecond},
		{19 * time.Second, time.Second},
	} {
		if got := untilTick(base.Add(tc.now), 10*time.Second); got != tc.want {
			t.Errorf("untilTick(+%v) = %v, want %v", tc.now, got, tc.want)
		}
	}
}
