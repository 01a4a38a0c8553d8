package bench

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/edgeproxy/edgeproxy/test/cluster"
)

// NodeName is the Node object both proxies run as.
const NodeName = "bench-node"

// World is one benchmark run's fixed parts: a real kube-apiserver (with
// etcd) on the host side of a veth, and the node namespace the proxies run
// in, one at a time.
type World struct {
	Cluster *cluster.Cluster
	Node    *Netns
	HostIP  netip.Addr // the API server listens here
	NodeIP  netip.Addr // the node's InternalIP, inside Node
	Dir     string
	// Kubeconfig reaches the API server from inside Node.
	Kubeconfig string
}

// NewWorld starts the control plane and the node namespace under dir.
func NewWorld(ctx context.Context, dir string) (_ *World, err error) {
	w := &World{Dir: dir,
		HostIP: netip.MustParseAddr("192.168.253.1"),
		NodeIP: netip.MustParseAddr("192.168.253.2")}
	defer func() {
		if err != nil {
			w.Close()
		}
	}()
	if w.Node, err = NewNetns("node"); err != nil {
		return nil, err
	}
	if err := w.Node.LinkHost(fmt.Sprintf("epb%d", os.Getpid()%100000), w.HostIP, w.NodeIP); err != nil {
		return nil, err
	}
	w.Cluster, err = cluster.Start(ctx, cluster.Options{
		BindAddress: w.HostIP.String(),
		ServiceCIDR: "10.96.0.0/16",
		Dir:         filepath.Join(dir, "cluster"),
	})
	if err != nil {
		return nil, err
	}
	w.Kubeconfig = filepath.Join(dir, "node.kubeconfig")
	if err := w.Cluster.WriteKubeconfig(w.Kubeconfig, fmt.Sprintf("https://%s:%d", w.HostIP, w.Cluster.Port())); err != nil {
		return nil, err
	}
	if _, err := w.Cluster.CreateNode(ctx, NodeName, "zone-a", w.NodeIP.String()); err != nil {
		return nil, fmt.Errorf("bench: node object: %w", err)
	}
	return w, nil
}

// Close stops everything NewWorld started.
func (w *World) Close() {
	if w.Cluster != nil {
		_ = w.Cluster.Stop()
	}
	if w.Node != nil {
		w.Node.Close()
	}
}

// Reset empties the node namespace for the next proxy: every table of
// both iptables backends and of nf_tables, and the conntrack table.
func (w *World) Reset() error {
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, table := range []string{"nat", "filter", "mangle"} {
			for _, op := range []string{"-F", "-X"} {
				if _, err := w.Node.Run(fam+"-legacy", "-w", "-t", table, op); err != nil {
					return err
				}
			}
		}
	}
	if _, err := w.Node.Run("nft", "flush", "ruleset"); err != nil {
		return err
	}
	_, _ = w.Node.Run("conntrack", "-F")
	return nil
}

// BackendPath makes a directory whose iptables, iptables-save and
// iptables-restore (and the ip6tables ones) are the given backend's, to put
// first in a proxy's PATH. Both proxies find the backend the same way.
func BackendPath(dir, backend string) (string, error) {
	if backend != "legacy" && backend != "nft" {
		return "", fmt.Errorf("bench: unknown iptables backend %q (want legacy or nft)", backend)
	}
	p := filepath.Join(dir, "path-"+backend)
	if err := os.MkdirAll(p, 0o755); err != nil {
		return "", err
	}
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			target, err := lookPath(fam + "-" + backend + suffix)
			if err != nil {
				return "", err
			}
			link := filepath.Join(p, fam+suffix)
			_ = os.Remove(link)
			if err := os.Symlink(target, link); err != nil {
				return "", err
			}
		}
	}
	return p, nil
}

func lookPath(name string) (string, error) {
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("bench: %s not found (Debian package iptables): %w", name, err)
	}
	return p, nil
}
