package netns_test

import (
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

func TestTopology(t *testing.T) {
	gate.Root(t)
	node := netns.NewNode(t, "node")
	a, b := node.AddPod("a"), node.AddPod("b")
	client := node.AddClient("client")
	for _, p := range []*netns.Pod{a, b} {
		if err := p.Serve(8080); err != nil {
			t.Fatal(err)
		}
	}
	// Pod to pod goes through the node; the pod sees the real source.
	r, err := a.TCP(b.AddrPort(8080), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if r.Name != "b" || r.Client.Addr() != a.IP {
		t.Fatalf("a -> b: got %+v", r)
	}
	r, err = client.UDP(a.AddrPort(8080), 40000, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if r.Name != "a" || r.Client.String() != "192.168.77.2:40000" {
		t.Fatalf("client -> a: got %+v", r)
	}
	r, err = client.TCP(b.AddrPort6(8080), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if r.Name != "b" || r.Client.Addr().String() != "fd00:77::2" {
		t.Fatalf("client -> b over IPv6: got %+v", r)
	}
	r, err = a.UDP(b.AddrPort6(8080), 0, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if r.Name != "b" || r.Client.Addr() != a.IP6 {
		t.Fatalf("a -> b over IPv6: got %+v", r)
	}
	r, err = node.TCP(b.AddrPort(8080), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if r.Name != "b" || r.Client.Addr() != node.Gateway {
		t.Fatalf("node -> b: got %+v", r)
	}
}
