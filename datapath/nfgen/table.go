package nfgen

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

const (
	msgNewTable   = 0 // NFT_MSG_NEWTABLE (the answer to GETTABLE)
	msgGetTable   = 1 // NFT_MSG_GETTABLE
	attrTableName = 1 // NFTA_TABLE_NAME
	attrTableUse  = 3 // NFTA_TABLE_USE: the table's chains, sets, objects
)

// Table asks nf_tables, in the calling thread's network namespace, for
// the table name of family (NFPROTO_IPV4, NFPROTO_IPV6, ...): whether it
// exists and its use count (chains, sets and objects in it). One
// NFT_MSG_GETTABLE on a socket of its own, as Current.
func Table(family uint8, name string) (use uint32, ok bool, err error) {
	const seq = 1
	attr := append([]byte(name), 0)
	n := unix.NLMSG_HDRLEN + 4 + (4+len(attr)+3)&^3
	req := binary.NativeEndian.AppendUint32(make([]byte, 0, n), uint32(n))
	req = binary.NativeEndian.AppendUint16(req, subsysNFTables<<8|msgGetTable)
	req = binary.NativeEndian.AppendUint16(req, unix.NLM_F_REQUEST)
	req = binary.NativeEndian.AppendUint32(req, seq)
	req = binary.NativeEndian.AppendUint32(req, 0)
	req = append(req, family, unix.NFNETLINK_V0, 0, 0) // nfgenmsg
	req = binary.NativeEndian.AppendUint16(req, uint16(4+len(attr)))
	req = binary.NativeEndian.AppendUint16(req, attrTableName)
	req = append(req, attr...)
	req = req[:n] // padding: the capacity's zeros
	var buf [4096]byte
	msgs, err := ask(req, buf[:])
	if err != nil {
		return 0, false, fmt.Errorf("nfgen: NFT_MSG_GETTABLE %s: %w", name, err)
	}
	for _, m := range msgs {
		switch {
		case m.Header.Seq != seq:
		case m.Header.Type == unix.NLMSG_ERROR:
			if len(m.Data) < 4 {
				return 0, false, fmt.Errorf("nfgen: NFT_MSG_GETTABLE %s: short netlink error", name)
			}
			errno := syscall.Errno(-int32(binary.NativeEndian.Uint32(m.Data)))
			if errno == unix.ENOENT {
				return 0, false, nil
			}
			return 0, false, fmt.Errorf("nfgen: NFT_MSG_GETTABLE %s: %w", name, errno)
		case m.Header.Type == subsysNFTables<<8|msgNewTable && len(m.Data) >= 4:
			attrs := m.Data[4:]
			for len(attrs) >= 4 {
				l := int(binary.NativeEndian.Uint16(attrs))
				typ := binary.NativeEndian.Uint16(attrs[2:]) & 0x3fff
				if l < 4 || l > len(attrs) {
					break
				}
				if typ == attrTableUse && l >= 8 {
					use = binary.BigEndian.Uint32(attrs[4:])
				}
				attrs = attrs[min((l+3)&^3, len(attrs)):]
			}
			return use, true, nil
		}
	}
	return 0, false, errors.New("nfgen: NFT_MSG_GETTABLE: no answer")
}
