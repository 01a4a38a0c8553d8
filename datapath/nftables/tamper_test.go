package nftables

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/nfgen"
	"github.com/edgeproxy/edgeproxy/internal/testkit/poll"
)

// watching starts p's WatchWrites, and returns once it is on; stop ends
// it (else the end of the test does).
func watching(t testing.TB, p *Proxier) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	written := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() { done <- p.WatchWrites(ctx, written) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("WatchWrites: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	select {
	case <-written:
	case err := <-done:
		t.Fatalf("the watch ended before it started: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the watch did not start within a minute")
	}
	return stop
}

// settle waits until the watch has read the events of every commit made
// so far: what Tampered then says covers them.
func settle(t testing.TB, p *Proxier) {
	t.Helper()
	poll.Until(t, time.Minute, "the watch reads the events of the last commit", func() error {
		gen, err := p.conn.GetGen()
		if err != nil {
			return err
		}
		p.events.mu.Lock()
		last, started := p.events.last, p.events.started
		p.events.mu.Unlock()
		if !started || genAfter(gen.ID, last) {
			return fmt.Errorf("generation %d, the watch at %d", gen.ID, last)
		}
		return nil
	})
}

var handleRE = regexp.MustCompile(`# handle (\d+)`)

// TestTamperedFromEvents: with the watch on, a hand edit inside our table
// that keeps every chain's name (a rule added, a rule deleted, an
// element added to our map, a base chain's policy) is seen, and the next
// full apply writes the table back as it was; another table's commits
// are not tampering.
func TestTamperedFromEvents(t *testing.T) {
	w := newWorld(t)
	reg := prometheus.NewRegistry()
	w.p.m, _ = newMetrics(reg)
	ctx := context.Background()
	if err := w.p.Apply(ctx, w.plan(1, 0, 1)); err != nil {
		t.Fatal(err)
	}
	watching(t, w.p)
	tampered := func() bool {
		t.Helper()
		settle(t, w.p)
		got, err := w.p.Tampered(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if tampered() {
		t.Fatal("tampered right after our own apply")
	}
	if _, err := w.node.Run("nft", "add", "table", "ip", "someone-else"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.node.Run("nft", "add", "chain", "ip", "someone-else", "c"); err != nil {
		t.Fatal(err)
	}
	if tampered() {
		t.Fatal("another table's commits counted as tampering")
	}
	ours := func() string {
		t.Helper()
		return canonical(listOurs(t, w.node.NS, "ip") + listOurs(t, w.node.NS, "ip6"))
	}
	want := ours()
	masqHandle := func() string {
		out, err := w.node.Run("nft", "-a", "list", "chain", "ip", TableName, "masquerading")
		if err != nil {
			t.Fatal(err)
		}
		m := handleRE.FindAllStringSubmatch(out, -1)
		if len(m) < 2 {
			t.Fatalf("no rule handles in:\n%s", out)
		}
		return m[len(m)-1][1] // the chain's last rule: masquerade
	}
	pod3 := w.pods[2]
	for i, hand := range []string{
		"add rule ip WEB svc-default/web/http counter",
		"insert rule ip WEB services ip daddr 10.96.0.10 drop",
		"delete rule ip edgeproxy masquerading handle MASQ",
		"add element ip SELF service-ips { 10.96.9.9 . tcp . 80 : goto svc-default/self }",
		"delete element ip6 edgeproxy cluster-ips { fd00:96::10 }",
		"chain ip edgeproxy filter-forward { policy drop ; }",
	} {
		hand = strings.Replace(hand, "MASQ", masqHandle(), 1)
		// The service tables of default/web and default/self.
		hand = strings.Replace(hand, "WEB", shardTable(svcName("default", "web", "")), 1)
		hand = strings.Replace(hand, "SELF", shardTable(svcName("default", "self", "")), 1)
		if _, err := w.node.Run("nft", strings.Fields(hand)...); err != nil {
			t.Fatalf("nft %s: %v", hand, err)
		}
		if !tampered() {
			t.Fatalf("nft %s not seen", hand)
		}
		next := w.plan(uint64(i+2), 0, 1)
		if err := w.p.Apply(ctx, next); err != nil {
			t.Fatal(err)
		}
		if st := w.p.LastStats(); !st.Rebuilt {
			t.Fatalf("after nft %s: %+v, want the table rewritten", hand, st)
		}
		if tampered() {
			t.Fatalf("after the rewrite that followed nft %s, still tampered", hand)
		}
		if got := ours(); got != want {
			t.Fatalf("after nft %s and the rewrite:\n%s\nwant:\n%s", hand, got, want)
		}
		if seen := reach(t, 20, pod3.NS, "10.96.0.10:80", false, pod3.IP); len(seen) != 2 {
			t.Fatalf("after the rewrite answered by %v, want both endpoints", seen)
		}
	}
	if n := testutil.ToFloat64(w.p.m.tamperUnknown); n != 0 {
		t.Fatalf("%s = %v with every event read", MetricTamperUnknown, n)
	}
}

// TestOwnAppliesNotTampered: none of our own applies counts as tampering
// while the watch reads their events: partial ones, full ones that send
// nothing, rewrites, and a table written whole at 500 Services whose
// events overrun the watch's (here smallest) buffer; nor do other
// tables' commits made between them.
func TestOwnAppliesNotTampered(t *testing.T) {
	w := newWorld(t)
	reg := prometheus.NewRegistry()
	w.p.m, _ = newMetrics(reg)
	ctx := context.Background()
	if err := w.p.Apply(ctx, w.plan(1, 0, 1)); err != nil {
		t.Fatal(err)
	}
	stop := watching(t, w.p)
	overruns := nfgen.Overruns()
	tampers := 0
	look := func(settled bool) {
		t.Helper()
		if settled {
			settle(t, w.p)
		}
		bad, err := w.p.Tampered(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if bad {
			tampers++
		}
	}
	gen := uint64(1)
	for i := range 60 {
		gen++
		pods := [][]int{{0}, {1}, {0, 1}}[i%3]
		plan := w.plan(gen, pods...)
		switch i % 4 {
		case 0, 1: // partial: only web changed
			plan.Full, plan.Changed = false, map[datapath.ServicePortName]bool{w.web: true}
		case 2: // a full compare
		case 3: // a rewrite, as after a reload
			if err := w.p.Reconfigure(w.p.opts); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.p.Apply(ctx, plan); err != nil {
			t.Fatal(err)
		}
		if i%5 == 0 {
			if _, err := w.node.Run("nft", "add", "table", "ip", fmt.Sprintf("other%d", i)); err != nil {
				t.Fatal(err)
			}
		}
		look(i%2 == 0) // a look before the events are read, too
	}
	if nfgen.Overruns() != overruns {
		t.Fatal("the events of one apply at a time overran the watch's buffer")
	}
	// A table written whole at 500 Services: far more events than the
	// smallest buffer holds.
	stop()
	w.p.eventBuffer = 4096
	watching(t, w.p)
	before := nfgen.Overruns()
	fs := slices.Clone(w.plan(gen).Frontends)
	for i := range 500 {
		s := svcName("bulk", fmt.Sprintf("s%d", i), "")
		eps := []datapath.Endpoint{{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}), 8080), Weight: 1}}
		fs = append(fs, clusterIP(s, datapath.TCP, fmt.Sprintf("10.97.%d.%d", i>>8, i&0xff), 80, eps...))
	}
	if err := w.p.Reconfigure(w.p.opts); err != nil {
		t.Fatal(err)
	}
	gen++
	if err := w.p.Apply(ctx, newPlan(gen, fs...)); err != nil {
		t.Fatal(err)
	}
	settle(t, w.p)
	if nfgen.Overruns() == before || testutil.ToFloat64(w.p.m.eventLosses) == 0 {
		t.Fatal("the events of 500 Services did not overrun the watch's buffer: the test did not test it")
	}
	look(true)
	gen++
	if err := w.p.Apply(ctx, w.plan(gen, 1)); err != nil {
		t.Fatal(err)
	}
	look(true)
	if tampers != 0 {
		t.Fatalf("%d of our own applies counted as tampering", tampers)
	}
	if n := testutil.ToFloat64(w.p.m.tamperUnknown); n != 0 {
		t.Fatalf("%s = %v: a gap of our own applies taken for someone else's", MetricTamperUnknown, n)
	}
	if !w.p.Unchanged() {
		t.Fatal("not Unchanged after a passing look")
	}
}

// TestTamperedLostEvents: when events were lost (the watch's buffer
// overran) over a commit not ours, what it touched is unknown and the
// tables are rewritten, counted; a gap our own apply fills is not.
func TestTamperedLostEvents(t *testing.T) {
	w := newWorld(t)
	reg := prometheus.NewRegistry()
	w.p.m, _ = newMetrics(reg)
	ctx := context.Background()
	if err := w.p.Apply(ctx, w.plan(1, 0, 1)); err != nil {
		t.Fatal(err)
	}
	gen := func() uint32 {
		g, err := w.p.conn.GetGen()
		if err != nil {
			t.Fatal(err)
		}
		return g.ID
	}
	// The watch's log, fed as the reader reports an overrun: a Commit
	// with Lost set (nfgen's own tests make the reader do so).
	w.p.events.start()
	w.p.events.seen(nfgen.Commit{Gen: gen(), Lost: true})
	if bad, err := w.p.Tampered(ctx); err != nil || bad {
		t.Fatalf("Tampered = %v, %v after the start", bad, err)
	}
	// Another table's commit, read whole; then our apply, whose events
	// are lost: the gap is ours alone.
	if _, err := w.node.Run("nft", "add", "table", "ip", "someone-first"); err != nil {
		t.Fatal(err)
	}
	w.p.events.seen(nfgen.Commit{Gen: gen(), Port: 1})
	next := w.plan(2, 0)
	next.Full, next.Changed = false, map[datapath.ServicePortName]bool{w.web: true}
	if err := w.p.Apply(ctx, next); err != nil {
		t.Fatal(err)
	}
	w.p.events.seen(nfgen.Commit{Gen: gen(), Lost: true})
	if bad, err := w.p.Tampered(ctx); err != nil || bad {
		t.Fatalf("Tampered = %v, %v after a gap of our own apply", bad, err)
	}
	if _, err := w.node.Run("nft", "add", "table", "ip", "someone-else"); err != nil {
		t.Fatal(err)
	}
	w.p.events.seen(nfgen.Commit{Gen: gen(), Lost: true})
	if bad, err := w.p.Tampered(ctx); err != nil || !bad {
		t.Fatalf("Tampered = %v, %v after a gap over someone else's commit, want true", bad, err)
	}
	if n := testutil.ToFloat64(w.p.m.tamperUnknown); n != 1 {
		t.Fatalf("%s = %v, want 1", MetricTamperUnknown, n)
	}
	if err := w.p.Apply(ctx, w.plan(3, 0, 1)); err != nil {
		t.Fatal(err)
	}
	if st := w.p.LastStats(); !st.Rebuilt {
		t.Fatalf("%+v, want the table rewritten", st)
	}
	// Events skipped (a generation missing) without an overrun reported.
	if _, err := w.node.Run("nft", "add", "table", "ip", "someone-more"); err != nil {
		t.Fatal(err)
	}
	w.p.events.seen(nfgen.Commit{Gen: gen() + 1})
	if bad, err := w.p.Tampered(ctx); err != nil || !bad {
		t.Fatalf("Tampered = %v, %v after a missing generation, want true", bad, err)
	}
}
