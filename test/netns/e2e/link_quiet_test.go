package e2e_test

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A quiet node: nothing changes in the cluster, and what crosses the
// node's one link to the API server is the steady state (issue 28, G4 and
// G5). With the default config (no proxyName) that is kube-proxy's three
// watches: the Services, the EndpointSlices and this Node, each started
// once and still open, no full read and no watch asked again within the
// window, and bookmarks only on the watches of the Services and
// EndpointSlices (the Node's holds one object). With a proxyName there is
// a fourth, of the Services labelled with it (none or a few: no
// bookmarks either). The bytes both ways at IP level (the host veth's
// counters) are logged, scaled to a day; they are the API server's
// bookmarks, TCP keepalives and HTTP/2 pings, whose numbers depend on the
// clock, so they are reported, not asserted (RATIONALE.md, "A quiet day";
// test/bench, -link-quiet, measures them beside kube-proxy).
// EDGEPROXY_QUIET_WINDOW sets the default config's window (2m); the one
// with a proxyName watches a quarter of it (at least 30 s).
func TestAPIQuietLink(t *testing.T) {
	window := 2 * time.Minute
	if s := os.Getenv("EDGEPROXY_QUIET_WINDOW"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("EDGEPROXY_QUIET_WINDOW: %v", err)
		}
		window = d
	}
	// What the agent watches: by resource and selector, whether the
	// watch asks for bookmarks.
	three := map[string]bool{"services": true, "endpointslices": true, "nodes": false}
	four := map[string]bool{"services (proxyName)": false}
	maps.Copy(four, three)
	for _, tc := range []struct {
		name, extra string
		window      time.Duration
		watches     map[string]bool
	}{
		{"default", "", window, three},
		{"proxyName", "proxyName: edgeproxy\n", max(window/4, 30*time.Second), four},
	} {
		t.Run(tc.name, func(t *testing.T) { quietLink(t, tc.extra, tc.window, tc.watches) })
	}
}

// quietLink runs an agent with extra config lines for window on a quiet
// cluster and checks that it reads nothing in it and keeps one open watch
// of each in want (by resource and selector: asks for bookmarks).
func quietLink(t *testing.T, extra string, window time.Duration, want map[string]bool) {
	w := newOutageWorldWith(t, extra)
	veth, err := hostLink(w.hostIP)
	if err != nil {
		t.Fatal(err)
	}
	// The first sync's snapshot and the watches' first answers settle.
	time.Sleep(5 * time.Second)
	start := time.Now()
	before, err := linkCounters(veth)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("quiet window of %v on %s (API server %s)", window, veth, w.hostIP)
	time.Sleep(window)
	after, err := linkCounters(veth)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)

	// Received by the host is what the node sent.
	out, in := after.rx.sub(before.rx), after.tx.sub(before.tx)
	perDay := float64(out.ip()+in.ip()) * float64(24*time.Hour) / float64(took)
	t.Logf("in %d B (%d packets), out %d B (%d packets) at IP level in %v: %.0f B a day",
		in.ip(), in.packets, out.ip(), out.packets, took.Round(time.Second), perDay)

	quiet := w.reads(t, start)
	t.Logf("reads in the window: %v", quiet)
	if len(quiet) != 0 {
		t.Errorf("reads in the quiet window: %v, want none", quiet)
	}
	// Every watch since the agent's start: started once, and not ended
	// (the audit log has a watch's ResponseStarted when it is opened and
	// its ResponseComplete when it ends).
	evs, err := w.cl.AuditEvents("edgeproxy", w.started)
	if err != nil {
		t.Fatal(err)
	}
	watches := map[string]bool{}
	open := map[string]int{}
	for _, e := range evs {
		if e.Verb != "watch" {
			continue
		}
		what := e.Resource()
		if strings.Contains(e.RequestURI, "labelSelector=service.kubernetes.io%2Fservice-proxy-name%3D") {
			what += " (proxyName)"
		}
		switch e.Stage {
		case "ResponseStarted":
			if _, dup := watches[what]; dup {
				t.Errorf("a second watch of %s: %s", what, e.RequestURI)
			}
			watches[what] = strings.Contains(e.RequestURI, "allowWatchBookmarks=true")
			open[what]++
		case "ResponseComplete":
			open[what]--
			t.Errorf("a watch of %s ended (code %v): %s", what, e.ResponseStatus, e.RequestURI)
		}
	}
	if fmt.Sprint(watches) != fmt.Sprint(want) {
		t.Errorf("watches (with bookmarks): %v, want %v", watches, want)
	}
	n := 0
	for _, o := range open {
		n += o
	}
	t.Logf("%d watches open: %v", n, open)
	if n != len(want) {
		t.Errorf("%d watches open (%v), want %d", n, open, len(want))
	}
}

// hostLink is the host-side interface that holds addr.
func hostLink(addr netip.Addr) (string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr() == addr {
				return ifc.Name, nil
			}
		}
	}
	return "", fmt.Errorf("no host interface has %s", addr)
}

// count is bytes and packets of one direction, as the kernel counts them
// on an Ethernet link (frames with their 14-byte header).
type count struct{ bytes, packets int64 }

func (c count) sub(o count) count { return count{c.bytes - o.bytes, c.packets - o.packets} }

// ip is the bytes less the Ethernet headers.
func (c count) ip() int64 { return c.bytes - 14*c.packets }

type counters struct{ rx, tx count }

func linkCounters(name string) (counters, error) {
	read := func(f string) (int64, error) {
		b, err := os.ReadFile(filepath.Join("/sys/class/net", name, "statistics", f))
		if err != nil {
			return 0, err
		}
		return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	}
	var c counters
	for _, v := range []struct {
		f string
		p *int64
	}{{"rx_bytes", &c.rx.bytes}, {"rx_packets", &c.rx.packets}, {"tx_bytes", &c.tx.bytes}, {"tx_packets", &c.tx.packets}} {
		n, err := read(v.f)
		if err != nil {
			return counters{}, err
		}
		*v.p = n
	}
	return c, nil
}
