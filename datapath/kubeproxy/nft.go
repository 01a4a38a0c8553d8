package kubeproxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/edgeproxy/edgeproxy/datapath/nfgen"
)

// kube-proxy's nftables tables are found (nfgen.Table) and deleted over
// nf_tables' netlink interface, in the calling thread's network namespace, so that
// no nft program is needed (an edgeproxy image may well lack it).

const (
	subsysNFTables = 10 // NFNL_SUBSYS_NFTABLES
	msgDelTable    = 2  // NFT_MSG_DELTABLE
	msgBatchBegin  = 0x10
	msgBatchEnd    = 0x11
	attrTableName  = 1 // NFTA_TABLE_NAME
)

// nftTableName is the table kube-proxy's nftables mode uses in each family.
const nftTableName = "kube-proxy"

// nftFamilies are the nftables families kube-proxy uses, by name.
var nftFamilies = []struct {
	name   string
	family uint8
}{{"ip", unix.NFPROTO_IPV4}, {"ip6", unix.NFPROTO_IPV6}}

// nftTables finds (and removes) kube-proxy's nftables tables. Chains in
// Found counts what the table holds (chains, sets and maps).
func nftTables(remove bool) (Report, error) {
	var rep Report
	var errs []error
	for _, f := range nftFamilies {
		use, ok, err := nfgen.Table(f.family, nftTableName)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !ok {
			continue
		}
		if remove {
			if err := nftDeleteTable(f.family, nftTableName); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		rep = append(rep, Found{Where: "nftables " + f.name + " " + nftTableName, Chains: int(use)})
	}
	return rep, errors.Join(errs...)
}

func nftSocket() (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return -1, fmt.Errorf("kubeproxy: nf_tables netlink: %w", err)
	}
	// Bounded, should an answer never come.
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 2}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("kubeproxy: nf_tables netlink: %w", err)
	}
	return fd, nil
}

// nlmsg appends a netlink message with an nfgenmsg header for family
// (resource id res) and payload to b.
func nlmsg(b []byte, typ, flags uint16, seq uint32, family uint8, res uint16, payload []byte) []byte {
	n := unix.NLMSG_HDRLEN + 4 + len(payload)
	b = binary.NativeEndian.AppendUint32(b, uint32(n))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, flags)
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0) // port id: the kernel's
	b = append(b, family, 0)
	b = binary.BigEndian.AppendUint16(b, res)
	b = append(b, payload...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// nameAttr is NFTA_TABLE_NAME holding name, NUL-terminated and padded.
func nameAttr(name string) []byte {
	v := append([]byte(name), 0)
	b := binary.NativeEndian.AppendUint16(nil, uint16(4+len(v)))
	b = binary.NativeEndian.AppendUint16(b, attrTableName)
	b = append(b, v...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// nftDeleteTable deletes table name of family in one nf_tables
// transaction, with everything in it.
func nftDeleteTable(family uint8, name string) error {
	fd, err := nftSocket()
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	const del = 2
	b := nlmsg(nil, msgBatchBegin, unix.NLM_F_REQUEST, 1, unix.AF_UNSPEC, subsysNFTables, nil)
	b = nlmsg(b, subsysNFTables<<8|msgDelTable, unix.NLM_F_REQUEST|unix.NLM_F_ACK, del, family, 0, nameAttr(name))
	b = nlmsg(b, msgBatchEnd, unix.NLM_F_REQUEST, 3, unix.AF_UNSPEC, subsysNFTables, nil)
	if err := unix.Sendto(fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("kubeproxy: NFT_MSG_DELTABLE %s: %w", name, err)
	}
	var buf [4096]byte
	for {
		n, _, err := unix.Recvfrom(fd, buf[:], 0)
		if err != nil {
			return fmt.Errorf("kubeproxy: NFT_MSG_DELTABLE %s answer: %w", name, err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return fmt.Errorf("kubeproxy: NFT_MSG_DELTABLE %s answer: %w", name, err)
		}
		for _, m := range msgs {
			if m.Header.Type != unix.NLMSG_ERROR {
				continue
			}
			if errno := nlError(m.Data); errno != 0 {
				return fmt.Errorf("kubeproxy: NFT_MSG_DELTABLE %s: %w", name, errno)
			}
			if m.Header.Seq == del {
				return nil
			}
		}
	}
}

// nlError is the errno of an NLMSG_ERROR payload (0: an acknowledgement).
func nlError(data []byte) syscall.Errno {
	if len(data) < 4 {
		return syscall.EINVAL
	}
	return syscall.Errno(-int32(binary.NativeEndian.Uint32(data)))
}
