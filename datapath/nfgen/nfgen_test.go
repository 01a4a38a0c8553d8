package nfgen_test

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/edgeproxy/edgeproxy/datapath/nfgen"
)

// message builds a generation message's payload: nfgenmsg, then the given
// attributes in network byte order.
func message(t testing.TB, attrs func(ae *netlink.AttributeEncoder)) []byte {
	t.Helper()
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	attrs(ae)
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte{unix.AF_UNSPEC, 0, 0, 0}, b...)
}

func TestParse(t *testing.T) {
	for _, c := range []struct {
		name    string
		data    []byte
		gen     uint32
		ok, err bool
	}{
		{name: "empty"},
		{name: "header only", data: []byte{0, 0, 0, 0}},
		{name: "gen id", data: message(t, func(ae *netlink.AttributeEncoder) {
			ae.Uint32(2, 4242) // NFTA_GEN_PROC_PID comes first in the kernel's answer
			ae.Uint32(1, 0x01020304)
		}), gen: 0x01020304, ok: true},
		{name: "other attributes only", data: message(t, func(ae *netlink.AttributeEncoder) {
			ae.Uint32(2, 7)
		})},
		{name: "truncated attribute", data: []byte{0, 0, 0, 0, 8, 0, 1, 0, 1}, err: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			gen, ok, err := nfgen.Parse(c.data)
			if (err != nil) != c.err || ok != c.ok || gen != c.gen {
				t.Errorf("Parse = %#x, %v, %v; want %#x, %v, error %v", gen, ok, err, c.gen, c.ok, c.err)
			}
		})
	}
}

// The NFT_MSG_NEWGEN event that ends every nf_tables transaction carries
// the new generation (here, as the kernel encodes it).
func ExampleParse() {
	event := []byte{
		unix.AF_UNSPEC, 0, 0, 0, // nfgenmsg
		8, 0, 1, 0, 0, 0, 0x30, 0x39, // NFTA_GEN_ID = 12345, big-endian
	}
	gen, ok, err := nfgen.Parse(event)
	fmt.Println(gen, ok, err)
	// Output: 12345 true <nil>
}
