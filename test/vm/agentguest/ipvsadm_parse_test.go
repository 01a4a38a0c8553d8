package agentguest

import (
	"net/netip"
	"strings"
	"testing"
)

// TestParseIPVSAdm reads both of ipvsadm's listings, IPv4 and IPv6 (runs
// on the host: pure parsing).
func TestParseIPVSAdm(t *testing.T) {
	list := `IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
TCP  10.96.100.10:80 wrr
  -> 10.244.0.2:8080              Masq    3      0          0
TCP  [fd00:96::10]:80 rr
  -> [fd00:244::2]:8080           Masq    1      0          4
  -> [fd00:244::3]:8080           Masq    1      1          3
UDP  [fd00:96::10]:80 rr
`
	vss, err := parseIPVSAdm(list)
	if err != nil {
		t.Fatal(err)
	}
	v6, ok := vss["TCP [fd00:96::10]:80"]
	if len(vss) != 3 || !ok || v6.Fields[0] != "rr" || len(v6.Reals) != 2 {
		t.Fatalf("parsed %+v", vss)
	}
	if f := v6.Reals[netip.MustParseAddrPort("[fd00:244::3]:8080")]; strings.Join(f, " ") != "Masq 1 1 3" {
		t.Errorf("real server fields %v", f)
	}
	if f := vss["TCP 10.96.100.10:80"].Reals[netip.MustParseAddrPort("10.244.0.2:8080")]; len(f) < 2 || f[1] != "3" {
		t.Errorf("IPv4 real server fields %v", f)
	}
	stats := `IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port               Conns   InPkts  OutPkts  InBytes OutBytes
  -> RemoteAddress:Port
TCP  [fd00:96::10]:80                   20      120        0     8000        0
  -> [fd00:244::2]:8080                 11       66        0     4400        0
`
	vss, err = parseIPVSAdm(stats)
	if err != nil {
		t.Fatal(err)
	}
	if f := vss["TCP [fd00:96::10]:80"].Reals[netip.MustParseAddrPort("[fd00:244::2]:8080")]; len(f) == 0 || f[0] != "11" {
		t.Errorf("stats real server fields %v", f)
	}
	if _, err := parseIPVSAdm("TCP  not-an-address wrr\n"); err == nil {
		t.Error("a bad virtual server line parsed")
	}
}
