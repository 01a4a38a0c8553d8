package bench

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/edgeproxy/edgeproxy/test/cluster"
	"github.com/edgeproxy/edgeproxy/test/proxies"
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
	// HostIf is the host side of the node's one veth: its kernel counters
	// are the node's link (LinkCount).
	HostIf string
	Dir    string
	// Kubeconfig reaches the API server from inside Node.
	Kubeconfig string
}

// NewWorld starts the control plane and the node namespace under dir.
func NewWorld(ctx context.Context, dir string) (_ *World, err error) {
	return NewWorldWith(ctx, dir, cluster.Options{})
}

// NewWorldWith is NewWorld with more cluster options (Audit); the address,
// service range and directory are the world's.
func NewWorldWith(ctx context.Context, dir string, opts cluster.Options) (_ *World, err error) {
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
	w.HostIf = fmt.Sprintf("epb%d", os.Getpid()%100000)
	if err := w.Node.LinkHost(w.HostIf, w.HostIP, w.NodeIP); err != nil {
		return nil, err
	}
	opts.BindAddress, opts.ServiceCIDR, opts.Dir = w.HostIP.String(), "10.96.0.0/16", filepath.Join(dir, "cluster")
	w.Cluster, err = cluster.Start(ctx, opts)
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

// Reset empties the node namespace for the next proxy (proxies.Reset).
func (w *World) Reset() error { return proxies.Reset(w.Node.Run) }
