// Command coredns is CoreDNS with only the plugins the cluster of the
// test/upstream tier uses: the kubernetes plugin answers for Services and
// pods, and nothing is forwarded (no address outside the harness's
// namespaces is ever asked). The directives keep CoreDNS's own order.
package main

import (
	"fmt"
	"os"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	// The order is CoreDNS's (core/dnsserver/zdirectives.go), less the
	// plugins not linked in.
	err := dnsserver.SetDirectives([]string{
		"ready", "health", "errors", "log", "loadbalance", "cache", "kubernetes", "loop",
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "coredns:", err)
		os.Exit(1)
	}
	coremain.Run()
}
