package netns

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// GET fetches path from addr (host:port) from inside the namespace, the
// exchange bounded by d (the connect by a second); an answer other than
// 200 is an error. The body is read up to 4 MiB.
func (n *NS) GET(addr, path string, d time.Duration) (string, error) {
	var conn net.Conn
	if err := n.Do(func() (err error) { conn, err = net.DialTimeout("tcp", addr, time.Second); return err }); err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(d))
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, addr); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return string(body), nil
}
