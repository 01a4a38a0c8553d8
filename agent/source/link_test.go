package source

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
)

// serve accepts connections on loopback and hands each to fn.
func serve(t *testing.T, fn func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() { // ends when ln is closed
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fn(c)
		}
	}()
	return ln.Addr().String()
}

func broke(l *Link) bool {
	select {
	case <-l.Broken():
		return true
	case <-time.After(2 * time.Second):
		return false
	}
}

// A peer that sends nothing but whose kernel answers the keepalive probes
// is heard from every probe interval, not only when it last sent data.
func TestLinkHearsKeepalive(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("TCP_INFO is read on Linux only")
	}
	held := make(chan net.Conn, 1)
	addr := serve(t, func(c net.Conn) { held <- c }) // never writes
	l := newLink(500*time.Millisecond, 500*time.Millisecond)
	c, err := l.DialContext(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	defer func() { (<-held).Close() }()
	if h := l.Heard(time.Now()); h.IsZero() || time.Since(h) > time.Second {
		t.Fatalf("Heard %v right after the handshake", h)
	}
	time.Sleep(2500 * time.Millisecond)
	if ago := time.Since(l.Heard(time.Now())); ago > 1500*time.Millisecond {
		t.Fatalf("last heard %v ago after 2.5s of silence with 0.5s keepalive; want the probes' answers", ago)
	}
}

// The end of a connection is reported, whether the peer closes it or the
// client does, and what was heard on it is kept.
func TestLinkReportsBrokenConnections(t *testing.T) {
	addr := serve(t, func(c net.Conn) { _, _ = c.Write([]byte("x")); c.Close() })
	l := NewLink()
	c, err := l.DialContext(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	for err == nil {
		_, err = c.Read(buf) // "x", then EOF
	}
	if !broke(l) {
		t.Fatal("a connection the peer closed was not reported")
	}
	if runtime.GOOS == "linux" && l.Heard(time.Now()).IsZero() {
		t.Error("what was heard on the ended connection was lost")
	}
	c.Close() // reported once only
	select {
	case <-l.Broken():
		t.Fatal("one end reported twice")
	default:
	}

	held := make(chan net.Conn, 1)
	addr = serve(t, func(c net.Conn) { held <- c })
	c, err = l.DialContext(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { (<-held).Close() }()
	c.Close()
	if !broke(l) {
		t.Fatal("a connection the client closed was not reported")
	}
}

// A dial that fails while its context is live is Unreachable, which
// client-go's reflector reads as a refused connection (and so retries its
// watch from the resourceVersion it has instead of listing again): an
// address that does not answer in time, and a port that refuses. A dial
// whose context ended is not.
func TestLinkDialUnreachable(t *testing.T) {
	l := NewLink()
	l.dialer.Timeout = 300 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	// 192.0.2.1 (TEST-NET-1) answers nothing: the dial times out, or finds
	// no route at once; either way it is unreachable.
	for _, addr := range []string{closed, "192.0.2.1:443"} {
		_, err := l.DialContext(context.Background(), "tcp", addr)
		var u *Unreachable
		if !errors.As(err, &u) {
			t.Fatalf("dial %s: %v, want an *Unreachable", addr, err)
		}
		if !utilnet.IsConnectionRefused(err) {
			t.Errorf("dial %s: %v is not a refused connection to client-go", addr, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.DialContext(ctx, "tcp", "192.0.2.1:443"); err == nil || utilnet.IsConnectionRefused(err) {
		t.Errorf("dial with a cancelled context: %v, want the context's error", err)
	}
}

// The link counts the bytes its connections move and the API client's
// reads that were answered: a GET of a resource is a list, one with
// watch=true a watch, and a list's next page (continue=) is the same
// list; /readyz is neither, nor a request that found no one.
func TestLinkUsage(t *testing.T) {
	body := strings.Repeat("x", 1000)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, body) }))
	defer srv.Close()
	l := NewLink()
	client := &http.Client{Transport: l.WrapTransport(&http.Transport{DialContext: l.DialContext})}
	for _, path := range []string{"/api/v1/services?limit=500", "/api/v1/services?continue=abc&limit=500",
		"/apis/discovery.k8s.io/v1/endpointslices?resourceVersion=5&watch=true", "/readyz"} {
		resp, err := client.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != body {
			t.Fatalf("GET %s: %d bytes, %v", path, len(b), err)
		}
	}
	// A request that finds no one is not a read.
	addr := srv.Listener.Addr().String()
	srv.Close()
	if resp, err := client.Get("http://" + addr + "/api/v1/nodes?watch=true"); err == nil {
		resp.Body.Close()
		t.Fatal("GET from a closed server answered")
	}
	u := l.Usage()
	if u.Lists != 1 || u.Watches != 1 {
		t.Errorf("%d lists, %d watches; want 1 and 1", u.Lists, u.Watches)
	}
	// Four bodies and their headers in; four requests out.
	if u.BytesIn < 4*1000 || u.BytesIn > 4*1000+4*300 || u.BytesOut < 4*50 || u.BytesOut > 4*400 {
		t.Errorf("%d bytes in, %d out; want four 1,000-byte bodies and their headers in, four requests out", u.BytesIn, u.BytesOut)
	}
}
