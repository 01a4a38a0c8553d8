package agentguest

import (
	"fmt"
	"maps"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
)

// admVS is one virtual server as ipvsadm lists it: the fields after its
// address (scheduler and flags with -Ln; Conns, InPkts, ... with --stats)
// and, per real server, the fields after its address (Forward, Weight,
// ActiveConn, InActConn with -Ln; Conns, ... with --stats).
type admVS struct {
	Fields []string
	Reals  map[netip.AddrPort][]string
}

// parseIPVSAdm reads `ipvsadm -Ln [--stats --exact]` into virtual servers
// keyed "PROTO addr:port" (IPv6 in brackets, as netip.AddrPort prints it).
func parseIPVSAdm(out string) (map[string]admVS, error) {
	vss := map[string]admVS{}
	var cur *admVS
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && (f[0] == "TCP" || f[0] == "UDP" || f[0] == "SCTP"):
			ap, err := netip.ParseAddrPort(f[1])
			if err != nil {
				return nil, fmt.Errorf("ipvsadm virtual server line %q: %w", line, err)
			}
			v := admVS{Fields: f[2:], Reals: map[netip.AddrPort][]string{}}
			vss[f[0]+" "+ap.String()] = v
			cur = &v
		case len(f) >= 2 && f[0] == "->" && cur != nil:
			ap, err := netip.ParseAddrPort(f[1])
			if err != nil {
				return nil, fmt.Errorf("ipvsadm real server line %q: %w", line, err)
			}
			cur.Reals[ap] = f[2:]
		}
	}
	return vss, nil
}

// admRun runs ipvsadm with args in the node, logs its output (unless
// quiet) and parses it.
func (w *world) admRun(t *testing.T, quiet bool, args ...string) map[string]admVS {
	t.Helper()
	out, err := w.node.Run("ipvsadm", args...)
	if err != nil {
		t.Fatalf("ipvsadm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	if !quiet {
		t.Logf("ipvsadm %s in the node:\n%s", strings.Join(args, " "), out)
	}
	vss, err := parseIPVSAdm(out)
	if err != nil {
		t.Fatal(err)
	}
	return vss
}

// ipvsadmIPv6 shows canary/web's IPv6 half as an operator sees it:
// `ipvsadm -Ln` (which lists both families; ipvsadm's -6 only qualifies
// fwmark services) has the virtual servers [webVIP6]:80 and the node's
// [IPv6]:30080, TCP and UDP, rr, each with a and b's IPv6 addresses,
// masqueraded, weight 1; `-t [webVIP6]:80` selects the IPv6 service alone.
// Then real IPv6 TCP connections from the outside client to [webVIP6]:80
// are answered by a and b inside their namespaces, and the per-real-server
// connection counters of `ipvsadm -Ln --stats` grow by exactly the
// connections each pod answered.
func (w *world) ipvsadmIPv6(t *testing.T) {
	gate.Binaries(t, "ipvsadm")
	vip6 := netip.AddrPortFrom(webVIP6, 80)
	a6, b6 := w.a.AddrPort6(podPort), w.b.AddrPort6(podPort)
	wantReals := map[netip.AddrPort][]string{a6: {"Masq", "1"}, b6: {"Masq", "1"}}
	check := func(vss map[string]admVS, key string) {
		t.Helper()
		v, ok := vss[key]
		if !ok {
			t.Errorf("ipvsadm lacks the IPv6 virtual server %s", key)
			return
		}
		if len(v.Fields) == 0 || v.Fields[0] != "rr" {
			t.Errorf("ipvsadm %s: scheduler fields %v, want rr", key, v.Fields)
		}
		got := map[netip.AddrPort][]string{}
		for ap, f := range v.Reals {
			got[ap] = f[:min(2, len(f))]
		}
		if !maps.EqualFunc(got, wantReals, func(x, y []string) bool { return strings.Join(x, " ") == strings.Join(y, " ") }) {
			t.Errorf("ipvsadm %s: real servers (forward, weight) %v, want %v", key, got, wantReals)
		}
	}
	all := w.admRun(t, false, "-Ln")
	np6 := netip.AddrPortFrom(w.node.LinkIP6, 30080)
	for _, key := range []string{"TCP " + vip6.String(), "UDP " + vip6.String(), "TCP " + np6.String(), "UDP " + np6.String()} {
		check(all, key)
	}
	one := w.admRun(t, false, "-Ln", "-t", vip6.String())
	if len(one) != 1 {
		t.Errorf("ipvsadm -Ln -t %s listed %d virtual servers, want 1", vip6, len(one))
	}
	check(one, "TCP "+vip6.String())

	conns := func(quiet bool) map[netip.AddrPort]int {
		v := w.admRun(t, quiet, "-Ln", "--stats", "--exact", "-t", vip6.String())["TCP "+vip6.String()]
		n := map[netip.AddrPort]int{}
		for ap, f := range v.Reals {
			if len(f) > 0 {
				n[ap], _ = strconv.Atoi(f[0])
			}
		}
		return n
	}
	// The kernel folds its per-CPU counters into what ipvsadm reads every
	// two seconds: the connections of the subtests before must be counted
	// before the baseline is taken (two equal reads 3s apart, bounded).
	var before map[netip.AddrPort]int
	prev := conns(true)
	w.waitFor(t, 30*time.Second, "ipvsadm --stats settled before the IPv6 connections", func() error {
		time.Sleep(3 * time.Second)
		before = conns(true)
		if !maps.Equal(before, prev) {
			prev = before
			return fmt.Errorf("counters still moving: %v", before)
		}
		return nil
	})
	conns(false)
	const total = 20
	answered := map[netip.AddrPort]int{}
	for i := range total {
		r, err := w.client.TCP(vip6, timeout)
		if err != nil {
			t.Fatalf("IPv6 connection %d to %s: %v", i, vip6, err)
		}
		switch r.Name {
		case "a":
			answered[a6]++
		case "b":
			answered[b6]++
		default:
			t.Fatalf("IPv6 connection %d to %s answered by %+v, want pod a or b", i, vip6, r)
		}
	}
	t.Logf("%d IPv6 TCP connections client -> %s: %d answered by a (%s), %d by b (%s)", total, vip6, answered[a6], a6, answered[b6], b6)
	if answered[a6] == 0 || answered[b6] == 0 {
		t.Errorf("rr over two IPv6 real servers reached only %v", answered)
	}
	// Wait for the fold again, bounded.
	w.waitFor(t, 20*time.Second, "ipvsadm --stats counting the IPv6 connections per real server", func() error {
		after := conns(true)
		for _, ap := range []netip.AddrPort{a6, b6} {
			if d := after[ap] - before[ap]; d != answered[ap] {
				return fmt.Errorf("%s: Conns grew by %d, its pod answered %d", ap, d, answered[ap])
			}
		}
		return nil
	})
	conns(false)
}
