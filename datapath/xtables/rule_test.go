package xtables

import (
	"bufio"
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestParseRoundTrip: every kind of match and target reads back as the
// rule it was written from.
func TestParseRoundTrip(t *testing.T) {
	a, p := netip.MustParseAddr, netip.MustParsePrefix
	rules := []Rule{
		{Matches: []Match{Src(p("10.0.0.0/8")), NotDst(p("127.0.0.0/8"))}, Target: Return},
		{Matches: []Match{NotSrc(p("fd00::/64")), DstHost(a("fd00::1")), DPort("tcp", 80)}, Comment: "a/b:c cluster IP", Target: JumpTo("EP-SVC-X")},
		{Matches: []Match{Proto("udp"), Probability(0.3333333333)}, Target: DNAT(netip.MustParseAddrPort("10.0.0.1:53"))},
		{Matches: []Match{Proto("sctp")}, Target: DNAT(netip.MustParseAddrPort("[fd00::2]:9000"))},
		{Matches: []Match{SrcLocal(), DstLocal()}, Target: MarkOr(0x4000)},
		{Matches: []Match{InIface("cni0")}, Comment: "pod traffic", Target: JumpTo("EP-SVC-X")},
		{Matches: []Match{NotInIface("veth+"), InSet("EP-CLUSTER-IP", "dst,dst")}, Target: JumpTo("EP-MARK-MASQ")},
		{Matches: []Match{CtState("NEW"), NotCtState("RELATED,ESTABLISHED,DNAT")}, Target: Drop},
		{Matches: []Match{CtOrigDst(a("172.30.0.1"), 443, "tcp")}, Comment: "source ranges", Target: JumpTo("EP-FW-X")},
		{Matches: []Match{Mark(0x4000)}, Target: Accept},
		{Matches: []Match{NotMark(0x4000)}, Target: MarkXor(0x4000)},
		{Matches: []Match{RecentSeen("EP-SEP-X", 10800)}, Target: JumpTo("EP-SEP-X")},
		{Matches: []Match{Proto("tcp"), RecentSet("EP-SEP-X")}, Target: DNAT(netip.MustParseAddrPort("10.0.0.1:80"))},
		{Matches: []Match{InSet("EP-CLUSTER-IP", "dst,dst"), NotInSet("EP-LOAD-BALANCER-SRC", "dst,dst,src")}, Comment: "x", Target: Reject},
		{Comment: "edgeproxy service traffic requiring SNAT", Target: Masquerade(true)},
		{Target: Masquerade(false)},
	}
	for _, r := range rules {
		if err := r.Validate(); err != nil {
			t.Fatalf("%s: %v", r.Text(), err)
		}
		got, err := ParseRule(r.Text())
		if err != nil {
			t.Fatal(err)
		}
		if got.Text() != r.Text() || !slices.Equal(got.Args(), r.Args()) || string(got.AppendDigest(nil)) != string(r.AppendDigest(nil)) {
			t.Errorf("ParseRule(%q) reads back as %q", r.Text(), got.Text())
		}
	}
}

// TestParseGolden: every rule both modes write (their golden files)
// reads back as itself, so the Fake takes whatever the datapaths write.
func TestParseGolden(t *testing.T) {
	files, _ := filepath.Glob("../iptables/testdata/*.golden")
	ipvs, _ := filepath.Glob("../ipvs/testdata/rules*.golden")
	files = append(files, ipvs...)
	if len(files) < 5 {
		t.Fatalf("golden files: %v", files)
	}
	n := 0
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		s := bufio.NewScanner(f)
		s.Buffer(nil, 1<<20)
		for s.Scan() {
			l := s.Text()
			if !strings.HasPrefix(l, "-A ") && !strings.HasPrefix(l, "-I ") {
				continue
			}
			_, rest, _ := strings.Cut(l[3:], " ")
			rest = strings.TrimPrefix(rest, "1 ")
			if _, err := ParseRule(rest); err != nil {
				t.Errorf("%s: %v", name, err)
			}
			n++
		}
		f.Close()
	}
	if n < 100 {
		t.Errorf("only %d rules read", n)
	}
}

func TestParseRefuses(t *testing.T) {
	for _, text := range []string{
		"-j",             // no target
		"-s 10.0.0.0/8",  // no target
		"-x 1 -j ACCEPT", // unknown option
		"-m comment --comment \"x\" -s 10.0.0.0/8 -j ACCEPT", // comment before a match
		"-m mark --mark 0x1/0x3 -j ACCEPT",                   // a mask the model does not write
		"-p tcp -m tcp --dport 80 --sport 1 -j ACCEPT",
		"-p icmp -j ACCEPT",                     // a protocol the model does not know
		"-d 10.0.0.1 -j ACCEPT",                 // not as written (no /32)
		"-j DNAT --to-destination 10.0.0.1",     // no port
		"-j MASQUERADE --to-ports 1",            // an option the model does not write
		"-m comment --comment \"open -j ACCEPT", // unterminated quote
		"! -p tcp -j ACCEPT",
		"-i -j ACCEPT",                   // no interface
		"-i a/b -j ACCEPT",               // not an interface name
		"-i vethisfartoolong+ -j ACCEPT", // longer than IFNAMSIZ
	} {
		if r, err := ParseRule(text); err == nil {
			t.Errorf("ParseRule(%q) = %q, want an error", text, r.Text())
		}
	}
}

func TestValidate(t *testing.T) {
	for _, r := range []Rule{
		{Matches: []Match{InSet("", "dst")}, Target: Accept},
		{Matches: []Match{InSet("EP-THIS-NAME-IS-FAR-TOO-LONG-FOR-IPSET", "dst")}, Target: Accept},
		{Matches: []Match{InSet("EP-X", "dst,dst,src,src")}, Target: Accept},
		{Matches: []Match{InSet("EP-X", "dest")}, Target: Accept},
		{Matches: []Match{Probability(1.5)}, Target: Accept},
		{Matches: []Match{InIface("")}, Target: Accept},
		{Matches: []Match{InIface("a+b")}, Target: Accept},
		{Matches: []Match{InIface("br 0")}, Target: Accept},
		{Matches: []Match{InIface("abcdefghijklmnop")}, Target: Accept},
		{Matches: []Match{{}}, Target: Accept},
		{Comment: `a "quote"`, Target: Accept},
		{Target: JumpTo("INPUT")},
		{Target: JumpTo("EP-" + strings.Repeat("X", MaxChainLen))},
		{Target: MarkOr(0)},
		{},
	} {
		if err := r.Validate(); err == nil {
			t.Errorf("%q validates", r.Text())
		}
	}
}

// TestTransactionTables: a transaction writes the tables it was made
// for, in that order, declarations first in the order declared, and
// refuses other tables.
func TestTransactionTables(t *testing.T) {
	tx := NewTransaction[string](NAT, Mangle)
	tx.Declare("u", Chain{NAT, "EP-B"})
	tx.Add("u", Chain{NAT, "EP-B"}, &Rule{Target: Return})
	tx.Declare("", Chain{NAT, "EP-A"})
	tx.Declare("", Chain{Mangle, "EP-M"})
	want := "*nat\n:EP-B - [0:0]\n:EP-A - [0:0]\n-A EP-B -j RETURN\nCOMMIT\n*mangle\n:EP-M - [0:0]\nCOMMIT\n"
	text, owners, err := tx.Render()
	if err != nil || string(text) != want {
		t.Fatalf("Render = %q, %v; want %q", text, err, want)
	}
	if !slices.Equal(owners, []string{"", "u", "", "u", "", "", "", ""}) {
		t.Errorf("owners = %q", owners)
	}
	tx.Declare("v", Chain{Filter, "EP-F"})
	_, _, err = tx.Render()
	var oe *OpError[string]
	if !errors.As(err, &oe) || oe.Owner != "v" || FailedOwner(err, owners) != "v" {
		t.Errorf("a chain of another table: %v, want an OpError of v", err)
	}
}

// TestFakeCommands: the commands the datapaths run, on the Fake.
func TestFakeCommands(t *testing.T) {
	ctx := context.Background()
	k := NewFake()
	err := k.RestoreNoFlush(ctx, []byte("*filter\n:EP-F - [0:0]\n-A EP-F -m conntrack --ctstate INVALID -j DROP\nCOMMIT\n"))
	if err != nil {
		t.Fatal(err)
	}
	jump := Rule{Matches: []Match{CtState("NEW")}, Comment: "edgeproxy x", Target: JumpTo("EP-F")}
	run := func(args ...string) error {
		_, err := k.Run(ctx, args...)
		return err
	}
	if run(append([]string{"-t", Filter, "-C", "INPUT"}, jump.Args()...)...) == nil {
		t.Error("-C finds a rule not inserted")
	}
	if err := run(append([]string{"-t", Filter, "-I", "INPUT", "1"}, jump.Args()...)...); err != nil {
		t.Fatal(err)
	}
	if err := run(append([]string{"-t", Filter, "-C", "INPUT"}, jump.Args()...)...); err != nil {
		t.Errorf("-C after -I: %v", err)
	}
	if run("-t", Filter, "-X", "EP-F") == nil {
		t.Error("-X of a chain jumped to")
	}
	out, _ := k.Run(ctx, "-t", Filter, "-S")
	if want := "-N EP-F\n-A EP-F -m conntrack --ctstate INVALID -j DROP\n-A INPUT -m conntrack --ctstate NEW -m comment --comment \"edgeproxy x\" -j EP-F\n"; out != want {
		t.Errorf("-S:\n%s\nwant:\n%s", out, want)
	}
	for _, args := range [][]string{
		append([]string{"-t", Filter, "-D", "INPUT"}, jump.Args()...),
		{"-t", Filter, "-F", "EP-F"},
		{"-t", Filter, "-X", "EP-F"},
	} {
		if err := run(args...); err != nil {
			t.Fatalf("%q: %v", args, err)
		}
	}
	if run("-t", Filter, "-n", "-L", "EP-F") == nil {
		t.Error("-L finds a deleted chain")
	}
	if d := k.Dump(); d != "" {
		t.Errorf("Dump after everything was removed:\n%s", d)
	}
	// A restore is all or nothing; the error names the line.
	err = k.RestoreNoFlush(ctx, []byte("*nat\n:EP-A - [0:0]\n-A EP-A -m foo -j ACCEPT\nCOMMIT\n"))
	var re *RestoreError
	if !errors.As(err, &re) || re.Line != 3 {
		t.Errorf("restore of an unknown match: %v, want a RestoreError on line 3", err)
	}
	if _, ok := k.Rules(Chain{NAT, "EP-A"}); ok {
		t.Error("a failed restore left a chain")
	}
}
