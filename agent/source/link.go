package source

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Link dials the API client's connections to the API server and keeps
// what they tell of it, so that a quiet cluster costs the agent nothing
// to tell from an unreachable one:
//
//   - Each connection has TCP keepalive: after linkIdle without a packet
//     from the API server, the kernel probes it, and the server's kernel
//     answers. Neither process wakes. Heard reads when the server last
//     answered anything (data or a probe) from the kernel (TCP_INFO), only
//     when someone asks.
//   - A server that stops answering is given up by the kernel after
//     linkIdle + linkInterval (and after linkUserTimeout when
//     data waits for its acknowledgement): the connection fails, and so
//     does one closed by the API client (its HTTP/2 health check: a PING
//     unanswered for 15 s). Broken says so; the heartbeat then asks the
//     API server whether it is there.
//
// The zero Link is not usable; make one with NewLink.
type Link struct {
	dialer net.Dialer
	mu     sync.Mutex
	conns  map[*linkConn]struct{}
	gone   time.Time     // Heard of the connections that ended, when they did
	broken chan struct{} // capacity 1: a connection failed or closed
	// What crossed the link: bytes read from and written to the
	// connections (TLS records, above TCP), and the reads asked
	// (WrapTransport).
	in, out        atomic.Int64
	lists, watches atomic.Int64
}

// LinkUsage is what the agent's connections to the API server moved and
// asked for since the start.
type LinkUsage struct {
	// BytesIn and BytesOut are the bytes read from and written to the
	// connections: TCP payload (TLS records), without TCP/IP headers.
	BytesIn  int64 `json:"bytesIn"`
	BytesOut int64 `json:"bytesOut"`
	// Lists are full reads of a resource (a LIST: at the start and after
	// 410 Gone); Watches are watch requests, each from the
	// resourceVersion the agent had (after a list, a timeout, an outage).
	Lists   int64 `json:"lists"`
	Watches int64 `json:"watches"`
}

// Usage returns what the link moved and asked for so far.
func (l *Link) Usage() LinkUsage {
	return LinkUsage{BytesIn: l.in.Load(), BytesOut: l.out.Load(), Lists: l.lists.Load(), Watches: l.watches.Load()}
}

// WrapTransport counts the API client's reads of resources that the API
// server answered (rest.Config.Wrap; not the ones that found no one): a
// GET with watch=true is a watch, any other GET of an /api or /apis path
// a list (the agent gets no single objects), its next pages (continue=)
// not again; /readyz and other paths are not counted.
func (l *Link) WrapTransport(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(r)
		if err == nil && r.Method == http.MethodGet && (strings.HasPrefix(r.URL.Path, "/api/") || strings.HasPrefix(r.URL.Path, "/apis/")) {
			switch q := r.URL.Query(); {
			case q.Get("watch") == "true":
				l.watches.Add(1)
			case q.Get("continue") == "": // a next page is the same list
				l.lists.Add(1)
			}
		}
		return resp, err
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Keepalive of the API connections: the kernel probes after linkIdle of
// silence, every linkInterval, and gives up once linkUserTimeout has
// passed without an answer and a probe went out (linkIdle+linkInterval,
// 20 s of silence), or when sent data has gone unacknowledged for
// linkUserTimeout.
//
// linkIdle is what a quiet link costs and how soon a silent one is found.
// On a quiet node the connection carries the bookmarks of the Service and
// EndpointSlice watches (together, once a minute) and client-go's HTTP/2
// ping (after 30 s without a frame); a probe and its answer are 104 bytes
// at IP level. At 10 s a minute had four probes, at 15 s it has two (at
// 15 s and 45 s, the ping between them): 0.3 MB a day less, for a silent
// link found 5 s later (RATIONALE.md, "A quiet day"). At 30 s or more
// the ping would find it, its unacknowledged write about 40 s after the
// last frame.
//
// linkUserTimeout is below client-go's HTTP/2 ping timeout (15 s, after
// 30 s without a frame) on purpose: a connection the kernel gives up fails
// its reads with ETIMEDOUT, and a watch ended by a timeout is resumed by
// client-go's reflector from the resourceVersion it has; a connection the
// ping gives up ends its watches with "http2: client connection lost", an
// error, and the reflector then lists everything again (see RATIONALE.md,
// "Why a short outage costs a resumed watch, not a relist").
const (
	linkIdle        = 15 * time.Second
	linkInterval    = 5 * time.Second
	linkProbes      = 2
	linkUserTimeout = 10 * time.Second
)

// NewLink returns a Link whose DialContext the API client uses.
func NewLink() *Link { return newLink(linkIdle, linkInterval) }

func newLink(idle, interval time.Duration) *Link {
	l := &Link{conns: map[*linkConn]struct{}{}, broken: make(chan struct{}, 1)}
	l.dialer = net.Dialer{
		Timeout:         30 * time.Second, // as client-go's own dialer
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: idle, Interval: interval, Count: linkProbes},
		Control:         setUserTimeout,
	}
	return l
}

// DialContext dials a connection to the API server (rest.Config.Dial). A
// dial that fails while ctx is live is an *Unreachable.
func (l *Link) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	c, err := l.dialer.DialContext(ctx, network, address)
	if err != nil {
		if ctx.Err() == nil {
			err = &Unreachable{Err: err}
		}
		return nil, err
	}
	lc := &linkConn{Conn: c, link: l}
	l.mu.Lock()
	l.conns[lc] = struct{}{}
	l.mu.Unlock()
	return lc, nil
}

// Unreachable is a failed dial to the API server: no answer in time, no
// route, a refusal. It reads as a refused connection to errors.As
// (syscall.ECONNREFUSED), since that is what client-go's reflector asks
// when a watch request fails: a refused watch is retried, with backoff,
// from the resourceVersion the reflector has, and any other failure makes
// it list everything again. An API server the link cannot reach for a
// while is the case the reflector keeps its resourceVersion for; when the
// server answers again and no longer has that version (410 Gone), the
// reflector lists then.
type Unreachable struct{ Err error }

func (u *Unreachable) Error() string { return "the API server is unreachable: " + u.Err.Error() }

func (u *Unreachable) Unwrap() error { return u.Err }

// As makes an Unreachable a syscall.ECONNREFUSED to errors.As (which
// client-go's utilnet.IsConnectionRefused uses).
func (u *Unreachable) As(target any) bool {
	if e, ok := target.(*syscall.Errno); ok {
		*e = syscall.ECONNREFUSED
		return true
	}
	return false
}

// Broken receives (coalesced) when a connection failed or was closed.
func (l *Link) Broken() <-chan struct{} { return l.broken }

// Heard is when the API server last answered on one of the connections,
// at the TCP level: data, or the acknowledgement of data or of a keepalive
// probe. Zero when none could tell.
func (l *Link) Heard(now time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	heard := l.gone
	for c := range l.conns {
		heard = later(heard, c.heard(now))
	}
	return heard
}

func (l *Link) lost(c *linkConn) {
	heard := c.heard(time.Now()) // the socket is still open
	l.mu.Lock()
	delete(l.conns, c)
	l.gone = later(l.gone, heard)
	l.mu.Unlock()
	select {
	case l.broken <- struct{}{}:
	default:
	}
}

// linkConn is a connection of the Link: its end, by error or by Close, is
// reported once.
type linkConn struct {
	net.Conn
	link *Link
	once sync.Once
}

// heard is when the peer last sent anything; zero if the kernel cannot
// tell.
func (c *linkConn) heard(now time.Time) time.Time {
	ago, ok := silentFor(c.Conn)
	if !ok {
		return time.Time{}
	}
	return now.Add(-ago)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (c *linkConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.link.in.Add(int64(n))
	if err != nil {
		c.once.Do(func() { c.link.lost(c) })
	}
	return n, err
}

func (c *linkConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.link.out.Add(int64(n))
	return n, err
}

func (c *linkConn) Close() error {
	c.once.Do(func() { c.link.lost(c) })
	return c.Conn.Close()
}
