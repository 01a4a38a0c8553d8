package bench

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"

	"github.com/vishvananda/netns"
)

// Netns is a named network namespace the harness created (visible to
// `ip netns`), with lo up.
type Netns struct {
	Name string
	h    netns.NsHandle
}

// NewNetns creates the namespace "epb<pid>-<name>".
func NewNetns(name string) (*Netns, error) {
	full := fmt.Sprintf("epb%d-%s", os.Getpid(), name)
	if out, err := exec.Command("ip", "netns", "add", full).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("bench: ip netns add %s: %v: %s", full, err, out)
	}
	h, err := netns.GetFromName(full)
	if err != nil {
		_ = exec.Command("ip", "netns", "del", full).Run()
		return nil, fmt.Errorf("bench: open netns %s: %w", full, err)
	}
	n := &Netns{Name: full, h: h}
	if _, err := n.Run("ip", "link", "set", "lo", "up"); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// Close deletes the namespace.
func (n *Netns) Close() {
	n.h.Close()
	_ = exec.Command("ip", "netns", "del", n.Name).Run()
}

// Command returns cmd run inside the namespace (ip netns exec execs it, so
// the PID is the command's own).
func (n *Netns) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
}

// Run runs a command inside the namespace and returns its output.
func (n *Netns) Run(name string, args ...string) (string, error) {
	out, err := n.Command(name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("bench: %s %s in %s: %v: %s", name, strings.Join(args, " "), n.Name, err, out)
	}
	return string(out), nil
}

// Do runs fn on a thread switched into the namespace. Sockets fn opens stay
// in the namespace after it returns.
func (n *Netns) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(n.h); err != nil {
			errc <- err
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- ferr // thread stays locked and is destroyed with this goroutine
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// OpenKernel opens the ground-truth reader for an iptables backend inside
// the namespace.
func (n *Netns) OpenKernel(backend string) (Kernel, error) {
	var k Kernel
	err := n.Do(func() error {
		var err error
		switch backend {
		case "legacy":
			k, err = OpenLegacy()
		case "nft":
			k, err = OpenNFT()
		default:
			err = fmt.Errorf("bench: unknown iptables backend %q (want legacy or nft)", backend)
		}
		return err
	})
	return k, err
}

// LinkHost connects the namespace to the host with a veth pair: host gets
// hostIP/30 on the host side, the namespace nodeIP/30 on "host0".
func (n *Netns) LinkHost(hostIf string, hostIP, nodeIP netip.Addr) error {
	steps := [][]string{
		{"ip", "link", "add", hostIf, "type", "veth", "peer", "name", "host0", "netns", n.Name},
		{"ip", "addr", "add", netip.PrefixFrom(hostIP, 30).String(), "dev", hostIf},
		{"ip", "link", "set", hostIf, "up"},
		{"ip", "netns", "exec", n.Name, "ip", "addr", "add", netip.PrefixFrom(nodeIP, 30).String(), "dev", "host0"},
		{"ip", "netns", "exec", n.Name, "ip", "link", "set", "host0", "up"},
	}
	for _, s := range steps {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("bench: %s: %v: %s", strings.Join(s, " "), err, out)
		}
	}
	return nil
}
