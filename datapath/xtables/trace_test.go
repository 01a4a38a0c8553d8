package xtables

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"strings"
	"testing"
)

// fakeWith is a Fake holding the restore input text.
func fakeWith(t *testing.T, text string) *Fake {
	t.Helper()
	k := NewFake()
	if err := k.RestoreNoFlush(context.Background(), []byte(text)); err != nil {
		t.Fatal(err)
	}
	return k
}

var (
	node   = netip.MustParseAddr("192.168.0.1")
	client = netip.MustParseAddr("198.51.100.1")
)

// TestTraceWalk: jumps, RETURN, marks, statistic branches and the hooks a
// packet passes, on a small hand-written ruleset.
func TestTraceWalk(t *testing.T) {
	k := fakeWith(t, `*nat
:EP-S - [0:0]
:EP-MARK - [0:0]
:EP-POST - [0:0]
:EP-SVC - [0:0]
-A EP-MARK -j MARK --or-mark 0x4000
-A EP-S -s 10.0.0.0/8 -j RETURN
-A EP-S -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j EP-MARK
-A EP-S -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j EP-SVC
-A EP-SVC -p tcp -m statistic --mode random --probability 0.2500000000 -j DNAT --to-destination 10.1.0.1:8080
-A EP-SVC -p tcp -j DNAT --to-destination 10.1.0.2:8080
-A EP-POST -m mark ! --mark 0x4000/0x4000 -j RETURN
-A EP-POST -j MASQUERADE
-I PREROUTING 1 -j EP-S
-I OUTPUT 1 -j EP-S
-I POSTROUTING 1 -j EP-POST
COMMIT
*filter
:EP-F - [0:0]
-A EP-F -d 10.96.0.2/32 -p tcp -m tcp --dport 80 -j REJECT
-A EP-F -m conntrack --ctorigdst 10.96.0.3 --ctorigdstport 80 --ctproto tcp -j DROP
-I FORWARD 1 -m conntrack --ctstate NEW -j EP-F
-I OUTPUT 1 -m conntrack --ctstate NEW -j EP-F
COMMIT
`)
	for _, c := range []struct {
		name string
		src  netip.Addr
		dst  string
		want string
	}{
		{"outside client: marked, DNATed, masqueraded", client, "10.96.0.1", "0.25 ACCEPT 10.1.0.1:8080 masq; 0.75 ACCEPT 10.1.0.2:8080 masq"},
		{"source returned early: no service", netip.MustParseAddr("10.2.0.1"), "10.96.0.1", "1 ACCEPT invalid AddrPort"},
		{"the node itself walks OUTPUT", node, "10.96.0.1", "0.25 ACCEPT 10.1.0.1:8080 masq; 0.75 ACCEPT 10.1.0.2:8080 masq"},
		{"filter REJECT", client, "10.96.0.2", "1 REJECT invalid AddrPort"},
		{"filter DROP by original destination", node, "10.96.0.3", "1 DROP invalid AddrPort"},
		{"a local destination skips FORWARD", client, node.String(), "1 ACCEPT invalid AddrPort local"},
	} {
		t.Run(c.name, func(t *testing.T) {
			paths, err := k.Trace(Packet{Src: c.src, Dst: netip.MustParseAddr(c.dst), Proto: "tcp", Port: 80}, []netip.Addr{node})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range paths {
				s := fmt.Sprintf("%v %s %s", math.Round(p.Probability*1e6)/1e6, p.Verdict, p.To)
				if p.Masquerade {
					s += " masq"
				}
				if p.Local {
					s += " local"
				}
				got = append(got, s)
			}
			if g := strings.Join(got, "; "); g != c.want {
				t.Errorf("got %s\nwant %s", g, c.want)
			}
		})
	}
}

// TestTraceInIface: -i sees the interface a packet arrived on, in the
// hooks before routing and INPUT and FORWARD; a "+" name matches by
// prefix; a packet the node sends arrived on none.
func TestTraceInIface(t *testing.T) {
	k := fakeWith(t, `*nat
:EP-S - [0:0]
:EP-MARK - [0:0]
:EP-POST - [0:0]
-A EP-MARK -j MARK --or-mark 0x4000
-A EP-S -i cni0 -j RETURN
-A EP-S -i veth+ -j RETURN
-A EP-S -j EP-MARK
-A EP-POST -m mark ! --mark 0x4000/0x4000 -j RETURN
-A EP-POST -j MASQUERADE
-I PREROUTING 1 -j EP-S
-I OUTPUT 1 -j EP-S
-I POSTROUTING 1 -j EP-POST
COMMIT
*filter
:EP-F - [0:0]
-A EP-F ! -i eth0 -j ACCEPT
-A EP-F -j DROP
-I FORWARD 1 -j EP-F
COMMIT
`)
	dst := netip.MustParseAddr("10.96.0.1")
	for _, c := range []struct {
		src   netip.Addr
		iface string
		want  string
	}{
		{client, "cni0", "ACCEPT"},
		{client, "veth1234", "ACCEPT"},
		{client, "cni01", "ACCEPT masq"}, // not the bridge's name: masqueraded, and not eth0
		{client, "eth0", "DROP"},         // dropped in FORWARD, before POSTROUTING
		{client, "vet", "ACCEPT masq"},
		{node, "cni0", "ACCEPT masq"}, // the node's own: no input interface
	} {
		paths, err := k.Trace(Packet{Src: c.src, Dst: dst, Proto: "tcp", Port: 80, InIface: c.iface}, []netip.Addr{node})
		if err != nil {
			t.Fatal(err)
		}
		got := string(paths[0].Verdict)
		if paths[0].Masquerade {
			got += " masq"
		}
		if len(paths) != 1 || got != c.want {
			t.Errorf("from %s on %q: %d paths, %s; want %s", c.src, c.iface, len(paths), got, c.want)
		}
	}
}

func TestTraceRefuses(t *testing.T) {
	k := fakeWith(t, "*nat\n:EP-S - [0:0]\n-A EP-S -m set --match-set EP-X dst,dst -j RETURN\n-I PREROUTING 1 -j EP-S\nCOMMIT\n")
	if _, err := k.Trace(Packet{Src: client, Dst: node, Proto: "tcp", Port: 1}, nil); err == nil || !strings.Contains(err.Error(), "ipset") {
		t.Errorf("a set match: %v, want an error naming ipset", err)
	}
	// A loop (iptables would refuse it; the Fake does not check).
	k = fakeWith(t, "*nat\n:EP-A - [0:0]\n:EP-B - [0:0]\n-A EP-A -j EP-B\n-I PREROUTING 1 -j EP-A\nCOMMIT\n")
	if err := k.RestoreNoFlush(context.Background(), []byte("*nat\n-A EP-B -j EP-A\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Trace(Packet{Src: client, Dst: node, Proto: "tcp", Port: 1}, nil); err == nil || !strings.Contains(err.Error(), "deeper") {
		t.Errorf("a loop: %v, want the depth error", err)
	}
}
