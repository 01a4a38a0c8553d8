package source

import (
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// setUserTimeout is the dialer's Control: data sent to the API server and
// not acknowledged for linkUserTimeout ends the connection (TCP's own
// retransmissions would take about 15 minutes).
func setUserTimeout(_, _ string, rc syscall.RawConn) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(linkUserTimeout/time.Millisecond))
	})
	if err != nil {
		return err
	}
	return serr
}

// silentFor is how long since the peer of c last sent anything (data or an
// acknowledgement), from the kernel's TCP_INFO.
func silentFor(c net.Conn) (time.Duration, bool) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var info *unix.TCPInfo
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil || ierr != nil {
		return 0, false
	}
	return time.Duration(min(info.Last_data_recv, info.Last_ack_recv)) * time.Millisecond, true
}
