package iptables

import (
	"encoding/binary"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/edgeproxy/edgeproxy/datapath"
)

// nftTable reports whether nf_tables holds table (iptables-nft's "nat"
// or "filter") in fam's family, in the calling thread's network
// namespace: one NFT_MSG_GETTABLE over netlink, a name only. iptables-nft
// keeps its tables there, so without them it holds nothing of ours, and
// CleanupAll need not run it (a start of nftables mode ran it some 50
// times per family to find nothing: about 250 ms of CPU). When it cannot
// tell, it says yes.
func nftTable(fam datapath.Family, table string) bool {
	family := uint8(unix.NFPROTO_IPV4)
	if fam == datapath.IPv6 {
		family = unix.NFPROTO_IPV6
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return true
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 2}); err != nil {
		return true
	}
	// nlmsghdr, nfgenmsg, NFTA_TABLE_NAME.
	name := append([]byte(table), 0)
	alen := 4 + len(name)
	n := unix.NLMSG_HDRLEN + 4 + (alen+3)&^3
	const seq = 1
	req := binary.NativeEndian.AppendUint32(nil, uint32(n))
	req = binary.NativeEndian.AppendUint16(req, unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETTABLE)
	req = binary.NativeEndian.AppendUint16(req, unix.NLM_F_REQUEST)
	req = binary.NativeEndian.AppendUint32(req, seq)
	req = binary.NativeEndian.AppendUint32(req, 0)
	req = append(req, family, unix.NFNETLINK_V0, 0, 0)
	req = binary.NativeEndian.AppendUint16(req, uint16(alen))
	req = binary.NativeEndian.AppendUint16(req, unix.NFTA_TABLE_NAME)
	req = append(req, name...)
	for len(req) < n {
		req = append(req, 0)
	}
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return true
	}
	var buf [8192]byte
	got, _, err := unix.Recvfrom(fd, buf[:], 0)
	if err != nil {
		return true
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:got])
	if err != nil {
		return true
	}
	for _, m := range msgs {
		if m.Header.Seq != seq {
			continue
		}
		if m.Header.Type == unix.NLMSG_ERROR && len(m.Data) >= 4 {
			return syscall.Errno(-int32(binary.NativeEndian.Uint32(m.Data))) != unix.ENOENT
		}
		return true // the table
	}
	return true
}
