package nfgen

import (
	"encoding/binary"
	"testing"

	"golang.org/x/sys/unix"
)

// event builds one nf_tables event: nlmsghdr, nfgenmsg (family, version
// 0, res_id), then the attributes.
func event(typ uint8, family uint8, port uint32, res uint16, attrs ...[]byte) []byte {
	var body []byte
	for _, a := range attrs {
		body = append(body, a...)
	}
	b := make([]byte, unix.NLMSG_HDRLEN+4, unix.NLMSG_HDRLEN+4+len(body))
	binary.NativeEndian.PutUint32(b[0:], uint32(cap(b)))
	binary.NativeEndian.PutUint16(b[4:], subsysNFTables<<8|uint16(typ))
	binary.NativeEndian.PutUint32(b[12:], port)
	b[16] = family
	binary.BigEndian.PutUint16(b[18:], res)
	return append(b, body...)
}

func nla(typ uint16, payload []byte) []byte {
	n := 4 + len(payload)
	b := make([]byte, (n+3)&^3)
	binary.NativeEndian.PutUint16(b[0:], uint16(n))
	binary.NativeEndian.PutUint16(b[2:], typ)
	copy(b[4:], payload)
	return b
}

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

// A rule of table "ours" then the generation message: one Commit,
// touched, with the generation, port, pid and name.
func TestReaderDatagram(t *testing.T) {
	var got []Commit
	r := &reader{cs: &Commits{
		Touches: func(f uint8, name []byte) bool { return f == unix.NFPROTO_IPV4 && string(name) == "ours" },
		Seen:    func(c Commit) { got = append(got, c) },
	}}
	d := append(event(6, unix.NFPROTO_IPV4, 77, 9, nla(attrObjTable, []byte("ours\x00"))),
		event(msgNewGen, 0, 77, 9, nla(attrGenID, be32(9)), nla(attrGenPID, be32(1234)), nla(attrGenName, []byte("nft\x00")))...)
	d = append(d, event(3, unix.NFPROTO_IPV6, 78, 10, nla(attrObjTable, []byte("ours\x00")))...)
	d = append(d, event(msgNewGen, 0, 78, 10, nla(attrGenID, be32(10)))...)
	r.datagram(d, false)
	want := []Commit{{Gen: 9, Port: 77, PID: 1234, Name: "nft", Touched: true}, {Gen: 10, Port: 78}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

// No datagram makes the reader panic, or report a Commit it did not read
// a generation for.
func FuzzReaderDatagram(f *testing.F) {
	f.Add(append(event(6, unix.NFPROTO_IPV4, 77, 9, nla(attrObjTable, []byte("ours\x00"))),
		event(msgNewGen, 0, 77, 9, nla(attrGenID, be32(9)), nla(attrGenPID, be32(1234)), nla(attrGenName, []byte("nft\x00")))...), false)
	f.Add(event(msgNewGen, 0, 1, 0, nla(attrGenID, be32(0))), true)
	f.Add([]byte{}, false)
	f.Fuzz(func(t *testing.T, d []byte, skip bool) {
		r := &reader{cs: &Commits{
			Touches: func(uint8, []byte) bool { return true },
			Seen: func(c Commit) {
				if c.Lost {
					t.Fatalf("a loss reported from a datagram: %+v", c)
				}
			},
		}, skip: skip, skipGen: 5}
		r.datagram(d, false)
	})
}
