package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/datapath/sysctl"
)

// conntrackMaxLimit caps the scaled nf_conntrack_max, as kube-proxy does.
const conntrackMaxLimit = 1 << 20

// conntrackSysctls returns the netfilter parameters c asks for on a node
// with numCPU CPUs, as kube-proxy's conntrack setup computes them: maxPerCore
// times the CPUs, at least min and at most 2^20, and the timeouts in whole
// seconds; a zero value asks for nothing.
func conntrackSysctls(c config.Conntrack, numCPU int) map[string]string {
	out := map[string]string{}
	if c.MaxPerCore > 0 {
		max := min(c.MaxPerCore*numCPU, conntrackMaxLimit)
		if max < c.Min && c.MaxPerCore*numCPU <= conntrackMaxLimit {
			max = c.Min
		}
		out["net/netfilter/nf_conntrack_max"] = strconv.Itoa(max)
	}
	secs := func(key string, d time.Duration) {
		if s := int(d / time.Second); s > 0 {
			out["net/netfilter/"+key] = strconv.Itoa(s)
		}
	}
	secs("nf_conntrack_tcp_timeout_established", c.TCPEstablishedTimeout)
	secs("nf_conntrack_tcp_timeout_close_wait", c.TCPCloseWaitTimeout)
	secs("nf_conntrack_udp_timeout", c.UDPTimeout)
	secs("nf_conntrack_udp_timeout_stream", c.UDPStreamTimeout)
	if c.TCPBeLiberal {
		out["net/netfilter/nf_conntrack_tcp_be_liberal"] = "1"
	}
	return out
}

// hashsizePath is the conntrack hash table size, raised to a quarter of
// nf_conntrack_max like kube-proxy does.
var hashsizePath = "/sys/module/nf_conntrack/parameters/hashsize"

// applyConntrack sets the conntrack parameters of c. Failures (e.g.
// nf_conntrack_max is read-only outside the host's network namespace) are
// logged: the proxy works with the kernel's values.
func applyConntrack(c config.Conntrack, log *slog.Logger) {
	want := conntrackSysctls(c, runtime.NumCPU())
	err := sysctl.Ensure(want)
	if max, ok := want["net/netfilter/nf_conntrack_max"]; ok && !strings.Contains(fmt.Sprint(err), "nf_conntrack_max") {
		n, _ := strconv.Atoi(max)
		err = errors.Join(err, raiseHashsize(n/4))
	}
	if err != nil {
		log.Warn("cannot set some conntrack parameters; the kernel's values stay", "err", err)
	}
}

func raiseHashsize(want int) error {
	b, err := os.ReadFile(hashsizePath)
	if err != nil {
		return fmt.Errorf("conntrack hashsize: %w", err)
	}
	if cur, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && cur >= want {
		return nil
	}
	if err := os.WriteFile(hashsizePath, []byte(strconv.Itoa(want)), 0o640); err != nil {
		return fmt.Errorf("conntrack hashsize: %w", err)
	}
	return nil
}
