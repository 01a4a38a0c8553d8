// Package nfgen reads nf_tables' ruleset generation: a counter the kernel
// bumps on every committed nf_tables transaction, in any table or family.
// It is the one reader of the generation message, for the iptables
// datapath's tamper fingerprint and for anything else that watches the
// ruleset (the benchmarks' kernel readers).
package nfgen

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

const (
	subsysNFTables = 10 // NFNL_SUBSYS_NFTABLES
	msgGetGen      = 16 // NFT_MSG_GETGEN
	attrGenID      = 1  // NFTA_GEN_ID
)

// Current returns the generation in the calling thread's network namespace.
func Current() (uint32, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return 0, fmt.Errorf("nfgen: nf_tables netlink: %w", err)
	}
	defer c.Close()
	return Query(c)
}

// Query asks over an open NETLINK_NETFILTER connection, in whatever
// namespace it was opened.
func Query(c *netlink.Conn) (uint32, error) {
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(subsysNFTables<<8 | msgGetGen), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, 0, 0, 0}, // nfgenmsg
	})
	if err != nil {
		return 0, fmt.Errorf("nfgen: NFT_MSG_GETGEN: %w", err)
	}
	for _, m := range msgs {
		if g, ok, err := Parse(m.Data); err != nil {
			return 0, fmt.Errorf("nfgen: NFT_MSG_GETGEN answer: %w", err)
		} else if ok {
			return g, nil
		}
	}
	return 0, errors.New("nfgen: NFT_MSG_GETGEN: no generation in the answer")
}

// Parse reads the generation from the payload of an nf_tables generation
// message (the answer to NFT_MSG_GETGEN, or the NFT_MSG_NEWGEN event that
// ends each transaction): its nfgenmsg header, then NFTA_GEN_ID. ok is
// false when the message carries no generation.
func Parse(data []byte) (gen uint32, ok bool, err error) {
	if len(data) < 4 {
		return 0, false, nil
	}
	ad, err := netlink.NewAttributeDecoder(data[4:])
	if err != nil {
		return 0, false, fmt.Errorf("nfgen: %w", err)
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		if ad.Type() == attrGenID {
			return ad.Uint32(), true, nil
		}
	}
	if err := ad.Err(); err != nil {
		return 0, false, fmt.Errorf("nfgen: %w", err)
	}
	return 0, false, nil
}
