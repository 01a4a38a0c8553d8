package nfgen_test

import (
	"encoding/binary"
	"errors"
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

// The reply reader takes the generation from the answer to its own
// request, and reports a netlink error as an errno.
func TestAnswer(t *testing.T) {
	msg := func(typ uint16, seq uint32, data []byte) []byte {
		b := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+len(data)+4)
		binary.NativeEndian.PutUint32(b[0:], uint32(unix.NLMSG_HDRLEN+len(data)))
		binary.NativeEndian.PutUint16(b[4:], typ)
		binary.NativeEndian.PutUint32(b[8:], seq)
		b = append(b, data...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		return b
	}
	gen := message(t, func(ae *netlink.AttributeEncoder) { ae.Uint32(1, 77) })
	other := message(t, func(ae *netlink.AttributeEncoder) { ae.Uint32(1, 5) })
	errno := -int32(unix.EPERM)
	eperm := binary.NativeEndian.AppendUint32(nil, uint32(errno))
	ack := binary.NativeEndian.AppendUint32(nil, 0)
	for _, c := range []struct {
		name string
		b    []byte
		gen  uint32
		err  error
	}{
		{name: "answer", b: msg(10<<8|15, 1, gen), gen: 77},
		{name: "another request's first", b: append(msg(10<<8|15, 9, other), msg(10<<8|15, 1, gen)...), gen: 77},
		{name: "ack then answer", b: append(msg(unix.NLMSG_ERROR, 1, ack), msg(10<<8|15, 1, gen)...), gen: 77},
		{name: "refused", b: msg(unix.NLMSG_ERROR, 1, eperm), err: unix.EPERM},
		{name: "nothing", b: msg(10<<8|15, 1, nil), err: errNoGen},
	} {
		t.Run(c.name, func(t *testing.T) {
			g, err := nfgen.Answer(c.b, 1)
			switch {
			case c.err == errNoGen && err == nil, c.err != nil && c.err != errNoGen && !errors.Is(err, c.err):
				t.Fatalf("Answer = %d, %v; want error %v", g, err, c.err)
			case c.err == nil && (err != nil || g != c.gen):
				t.Fatalf("Answer = %d, %v; want %d", g, err, c.gen)
			}
		})
	}
}

var errNoGen = errors.New("no generation")
