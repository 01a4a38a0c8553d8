package nftables

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/edgeproxy/edgeproxy/datapath/sysctl"
)

// sysctls are the kernel parameters the mode needs, as the iptables mode
// sets them: IPv4 forwarding always (a DNAT to a pod on another node, or
// through the pod bridge, is forwarded), IPv6 forwarding when IPv6 is
// proxied and KeepIPv6Forwarding does not hold it back.
func (o *Options) sysctls() map[string]string {
	want := map[string]string{"net/ipv4/ip_forward": "1"}
	if o.IPv6 && !o.KeepIPv6Forwarding {
		want["net/ipv6/conf/all/forwarding"] = "1"
	}
	return want
}

// ensureSysctls sets o.sysctls() in the namespace the Proxier programs:
// with NetNS, from a thread of its own that enters it and is never used
// again (the runtime ends a thread still locked when its goroutine
// returns); otherwise in the calling thread's, as the other modes do.
func (o *Options) ensureSysctls() error {
	if o.NetNS == 0 {
		return sysctl.Ensure(o.sysctls())
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread goes with the goroutine
		if err := unix.Setns(o.NetNS, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("nftables: sysctls: enter the network namespace: %w", err)
			return
		}
		errc <- sysctl.Ensure(o.sysctls())
	}()
	return <-errc
}

// setSysctls sets the mode's sysctls; a failure is kept for SysctlErrors
// and logged, not fatal (some are read-only in containers).
func (p *Proxier) setSysctls() {
	p.sysctlErr = p.opts.ensureSysctls()
	if p.sysctlErr != nil {
		p.log.Warn("cannot set the sysctls the datapath needs; some traffic may not be forwarded", "err", p.sysctlErr)
	}
}

// SysctlErrors returns the sysctls New (or the last Reconfigure) could
// not set, joined, or nil.
func (p *Proxier) SysctlErrors() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sysctlErr
}
