package netns_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/netns"
)

// A typical kernel test: a node with two pods and an outside client.
func Example() {
	var t *testing.T // the test's own
	node := netns.NewNode(t, "node")
	a := node.AddPod("a")
	_ = a.Serve(8080)
	client := node.AddClient("client")
	r, err := client.TCP(netip.AddrPortFrom(a.IP, 8080), 2*time.Second)
	if err == nil && r.Name == "a" {
		// r.Client is the address pod a saw.
	}
}
