package healthcheck_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/agent/healthcheck"
	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// The servers run inside a node namespace, so the ports cannot clash with
// anything on the host; the client dials from the outside-client namespace.
func setup(t *testing.T, addrs []netip.Addr, healthy ...func() bool) (*healthcheck.Servers, *netns.Node, *http.Client) {
	gate.Root(t)
	node := netns.NewNode(t, "node")
	client := node.AddClient("client")
	var proxyHealthy func() bool
	if len(healthy) > 0 {
		proxyHealthy = healthy[0]
	}
	s := healthcheck.New(healthcheck.Options{
		Addresses:    addrs,
		ProxyHealthy: proxyHealthy,
		Listen: func(network, addr string) (l net.Listener, err error) {
			err = node.Do(func() error {
				l, err = net.Listen(network, addr)
				return err
			})
			return l, err
		},
	})
	t.Cleanup(func() { _ = s.Close() })
	hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
			err = client.Do(func() error {
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}}
	return s, node, hc
}

type body struct {
	Service        struct{ Namespace, Name string }
	LocalEndpoints int
	ProxyHealthy   bool `json:"serviceProxyHealthy"`
}

func get(hc *http.Client, node *netns.Node, port int) (int, body, error) {
	var b body
	resp, err := hc.Get(fmt.Sprintf("http://%s:%d/", node.LinkIP, port))
	if err != nil {
		return 0, b, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&b); err != nil {
		return resp.StatusCode, b, err
	}
	return resp.StatusCode, b, nil
}

func TestUpdate(t *testing.T) {
	s, node, hc := setup(t, nil)
	if err := s.Update(map[uint16]healthcheck.Info{
		30001: {Namespace: "default", Name: "a", LocalEndpoints: 2},
		30002: {Namespace: "default", Name: "b", LocalEndpoints: 0},
	}); err != nil {
		t.Fatal(err)
	}
	code, b, err := get(hc, node, 30001)
	if err != nil || code != 200 || b.LocalEndpoints != 2 || b.Service.Namespace != "default" || b.Service.Name != "a" {
		t.Fatalf("port 30001: %d %+v %v, want 200 with 2 local endpoints of default/a", code, b, err)
	}
	code, b, err = get(hc, node, 30002)
	if err != nil || code != 503 || b.LocalEndpoints != 0 {
		t.Fatalf("port 30002: %d %+v %v, want 503", code, b, err)
	}

	// b gains an endpoint, a is gone.
	if err := s.Update(map[uint16]healthcheck.Info{30002: {Namespace: "default", Name: "b", LocalEndpoints: 1}}); err != nil {
		t.Fatal(err)
	}
	if code, b, err = get(hc, node, 30002); err != nil || code != 200 || b.LocalEndpoints != 1 {
		t.Fatalf("port 30002 after update: %d %+v %v, want 200", code, b, err)
	}
	if _, _, err = get(hc, node, 30001); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("port 30001 after removal: %v, want connection refused", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err = get(hc, node, 30002); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("port 30002 after Close: %v, want connection refused", err)
	}
}

func TestAddressesAndConflicts(t *testing.T) {
	s, node, hc := setup(t, []netip.Addr{netip.MustParseAddr("192.168.77.1")})
	// Another listener holds 30005 on all addresses: that port fails, the
	// other is served.
	var busy net.Listener
	if err := node.Do(func() (err error) { busy, err = net.Listen("tcp", ":30005"); return err }); err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	err := s.Update(map[uint16]healthcheck.Info{
		30004: {Namespace: "default", Name: "a", LocalEndpoints: 1},
		30005: {Namespace: "default", Name: "c", LocalEndpoints: 1},
	})
	if err == nil {
		t.Fatal("Update with a busy port returned no error")
	}
	if code, _, err := get(hc, node, 30004); err != nil || code != 200 {
		t.Fatalf("port 30004: %d %v, want 200", code, err)
	}
	// Only the configured address listens.
	var c net.Conn
	err = node.Do(func() (err error) { c, err = net.DialTimeout("tcp", "10.244.0.1:30004", time.Second); return err })
	if err == nil {
		c.Close()
		t.Fatal("health check answered on an address outside Options.Addresses")
	}
}

// While the proxy itself is unhealthy every port answers 503, local
// endpoints or not, as kube-proxy's service health server.
func TestProxyUnhealthy(t *testing.T) {
	var sick atomic.Bool
	s, node, hc := setup(t, nil, func() bool { return !sick.Load() })
	if err := s.Update(map[uint16]healthcheck.Info{30001: {Namespace: "default", Name: "a", LocalEndpoints: 2}}); err != nil {
		t.Fatal(err)
	}
	if code, b, err := get(hc, node, 30001); err != nil || code != 200 || !b.ProxyHealthy {
		t.Fatalf("healthy proxy: %d %+v %v, want 200", code, b, err)
	}
	sick.Store(true)
	if code, b, err := get(hc, node, 30001); err != nil || code != 503 || b.ProxyHealthy || b.LocalEndpoints != 2 {
		t.Fatalf("unhealthy proxy: %d %+v %v, want 503 with 2 local endpoints", code, b, err)
	}
}
