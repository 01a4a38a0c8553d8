package nfgen_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/datapath/nfgen"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// commitLog collects what a WatchCommits reports.
type commitLog struct {
	mu  sync.Mutex
	all []nfgen.Commit
}

func (l *commitLog) seen(c nfgen.Commit) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all = append(l.all, c)
}

// upTo waits until a Commit of generation gen (or later) was reported and
// returns every one so far.
func (l *commitLog) upTo(t *testing.T, gen uint32) []nfgen.Commit {
	t.Helper()
	for deadline := time.Now().Add(signalWait); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		l.mu.Lock()
		all := append([]nfgen.Commit(nil), l.all...)
		l.mu.Unlock()
		if n := len(all); n > 0 && int32(all[n-1].Gen-gen) >= 0 {
			return all
		}
	}
	t.Fatalf("no commit of generation %d reported within %v", gen, signalWait)
	return nil
}

// watchCommits runs WatchCommits in ns, caring for tables named "ours" in
// family ip, until the test ends; it returns once the watch is on.
func watchCommits(t *testing.T, ns *netns.NS, buffer int) (*commitLog, func() error) {
	t.Helper()
	l := &commitLog{}
	ctx, cancel := context.WithCancel(context.Background())
	changed := make(chan struct{}, 1)
	done := make(chan error, 1)
	cs := nfgen.Commits{
		Touches: func(family uint8, name []byte) bool { return family == 2 && string(name) == "ours" },
		Seen:    l.seen,
		Buffer:  buffer,
	}
	go func() { done <- ns.Do(func() error { return nfgen.WatchCommits(ctx, changed, cs) }) }()
	var err error
	var once sync.Once
	stop := func() error {
		once.Do(func() { cancel(); err = <-done })
		return err
	}
	t.Cleanup(func() { _ = stop() })
	signalled(t, changed, "the subscription")
	return l, stop
}

func current(t *testing.T, ns *netns.NS) uint32 {
	t.Helper()
	var g uint32
	if err := ns.Do(func() (err error) { g, err = nfgen.Current(); return err }); err != nil {
		t.Fatal(err)
	}
	return g
}

// Each transaction is reported with its generation, who sent it, and
// whether it touched a table of interest: by any kind of object (table,
// chain, rule, set, element, a chain's policy); the first report is the
// generation at the start, lost.
func TestWatchCommits(t *testing.T) {
	gate.Root(t)
	gate.Binaries(t, "nft")
	ns := netns.New(t, "commits")
	nft(t, ns, "add", "table", "ip", "ours")
	start := current(t, ns)
	l, stop := watchCommits(t, ns, 0)
	for _, c := range []struct {
		cmd     string
		touched bool
	}{
		{"add table ip other", false},
		{"add chain ip ours c", true},
		{"add chain ip other c", false},
		{"add rule ip ours c counter", true},
		{"add set ip ours s { type ipv4_addr ; }", true},
		{"add element ip ours s { 10.0.0.1 }", true},
		{"delete element ip ours s { 10.0.0.1 }", true},
		{"add chain ip ours base { type filter hook input priority 0 ; policy accept ; }", true},
		{"chain ip ours base { policy drop ; }", true},
		{"add table ip6 ours", false}, // another family
		{"add table inet ours", false},
		{"flush chain ip ours c", true},
		{"delete table ip ours", true},
	} {
		nft(t, ns, strings.Fields(c.cmd)...)
		gen := current(t, ns)
		all := l.upTo(t, gen)
		got := all[len(all)-1]
		if got.Gen != gen || got.Lost || got.Touched != c.touched || got.Name != "nft" || got.PID == 0 || got.Port == 0 {
			t.Fatalf("nft %s: reported %+v, want generation %d, touched %v, by nft", c.cmd, got, gen, c.touched)
		}
	}
	all := l.upTo(t, start)
	if first := all[0]; first.Gen != start || !first.Lost {
		t.Fatalf("first report %+v, want generation %d lost", first, start)
	}
	for i := 1; i < len(all); i++ {
		if all[i].Lost || all[i].Gen != all[i-1].Gen+1 {
			t.Fatalf("reports %d and %d: %+v then %+v, want consecutive generations", i-1, i, all[i-1], all[i])
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("WatchCommits = %v, want nil", err)
	}
}

// An overrun of the buffer is reported as a loss up to the current
// generation (the events of those transactions still queued are not
// reported on their own), and the transactions after it whole.
func TestWatchCommitsOverrun(t *testing.T) {
	gate.Root(t)
	gate.Binaries(t, "nft")
	ns := netns.New(t, "commitsoverrun")
	release, restore := nfgen.HoldReads()
	l, stop := watchCommits(t, ns, 4096)
	t.Cleanup(func() { release(); _ = stop(); restore() })
	var b strings.Builder
	b.WriteString("add table ip ours\nadd chain ip ours c\n")
	for i := range 2000 {
		fmt.Fprintf(&b, "add rule ip ours c tcp dport %d accept\n", 1+i)
	}
	file := filepath.Join(t.TempDir(), "big.nft")
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	before := nfgen.Overruns()
	nft(t, ns, "-f", file)
	big := current(t, ns)
	nft(t, ns, "add", "table", "ip", "other") // queued behind the overrun
	release()
	all := l.upTo(t, big)
	if nfgen.Overruns() == before {
		t.Fatal("2,000 rules did not overrun the buffer: the test no longer covers overruns")
	}
	if c := all[len(all)-1]; !c.Lost || int32(c.Gen-big) < 0 {
		t.Fatalf("after the overrun: %+v, want a loss up to generation %d or later", c, big)
	}
	for _, c := range all {
		if c.Gen == big && !c.Lost {
			t.Fatalf("the overrun transaction reported as whole: %+v", c)
		}
	}
	nft(t, ns, "add", "chain", "ip", "ours", "d")
	gen := current(t, ns)
	all = l.upTo(t, gen)
	if c := all[len(all)-1]; c.Gen != gen || c.Lost || !c.Touched {
		t.Fatalf("the commit after the overrun: %+v, want generation %d whole and touched", c, gen)
	}
}
