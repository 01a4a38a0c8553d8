// Package nfgen reads nf_tables' ruleset generation: a counter the kernel
// bumps on every committed nf_tables transaction, in any table or family.
// It is the one reader of the generation message, for the iptables
// datapath's tamper fingerprint and for anything else that watches the
// ruleset (the benchmarks' kernel readers), and it watches the commits
// themselves (Watch), so that a quiet node need not poll the generation.
package nfgen

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

const (
	subsysNFTables = 10 // NFNL_SUBSYS_NFTABLES
	msgGetGen      = 16 // NFT_MSG_GETGEN
	attrGenID      = 1  // NFTA_GEN_ID
)

// Current returns the generation in the calling thread's network namespace.
//
// It speaks netlink with plain blocking syscalls on a socket of its own:
// the kernel queues the answer before sendto returns, so nothing waits, and
// the socket never meets the Go runtime's poller (a netlink.Conn registers
// with epoll and starts a goroutine's worth of bookkeeping, which was most
// of what a quiet agent's tamper check cost).
func Current() (uint32, error) {
	const seq = 1
	var req [unix.NLMSG_HDRLEN + 4]byte // nlmsghdr, then nfgenmsg (AF_UNSPEC, version 0, resource 0)
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], subsysNFTables<<8|msgGetGen)
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(req[8:], seq)
	var buf [512]byte // the answer is a few dozen bytes
	msgs, err := ask(req[:], buf[:])
	if err != nil {
		return 0, fmt.Errorf("nfgen: NFT_MSG_GETGEN: %w", err)
	}
	return answer(msgs, seq)
}

// ask sends one request on a NETLINK_NETFILTER socket of its own, in the
// calling thread's network namespace, and returns the messages of the one
// datagram that answers it, read into buf. The socket never meets the
// runtime's poller, and its read is bounded (1 s), should the answer
// never come.
func ask(req, buf []byte) ([]syscall.NetlinkMessage, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("nf_tables netlink: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 1}); err != nil {
		return nil, fmt.Errorf("nf_tables netlink: %w", err)
	}
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, err
	}
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return nil, fmt.Errorf("answer: %w", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return nil, fmt.Errorf("answer: %w", err)
	}
	return msgs, nil
}

// answer reads the generation from the messages of a NFT_MSG_GETGEN reply
// to request seq: a netlink error, or a generation message.
func answer(msgs []syscall.NetlinkMessage, seq uint32) (uint32, error) {
	for _, m := range msgs {
		if m.Header.Seq != seq {
			continue
		}
		if m.Header.Type == unix.NLMSG_ERROR {
			if len(m.Data) < 4 {
				return 0, errors.New("nfgen: NFT_MSG_GETGEN: short netlink error")
			}
			if e := int32(binary.NativeEndian.Uint32(m.Data)); e != 0 {
				return 0, fmt.Errorf("nfgen: NFT_MSG_GETGEN: %w", syscall.Errno(-e))
			}
			continue
		}
		if g, ok, err := Parse(m.Data); err != nil {
			return 0, fmt.Errorf("nfgen: NFT_MSG_GETGEN answer: %w", err)
		} else if ok {
			return g, nil
		}
	}
	return 0, errors.New("nfgen: NFT_MSG_GETGEN: no generation in the answer")
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
