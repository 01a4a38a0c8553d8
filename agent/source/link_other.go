//go:build !linux

package source

import (
	"net"
	"syscall"
	"time"
)

func setUserTimeout(string, string, syscall.RawConn) error { return nil }

func silentFor(net.Conn) (time.Duration, bool) { return 0, false }
