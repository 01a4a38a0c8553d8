// Package switchguest is the guest half of test/vm's switch tests:
// TestSwitchKubeProxyIPVS, a live node switched from kube-proxy's IPVS
// mode to edgeproxy's and back, and TestSwitchNFTablesIPVS, between
// edgeproxy's nftables and IPVS modes, each under a stream of new
// connections and a set of established flows. This file holds what both halves share: the world's
// names and addresses, the setup the host hands the guest, and the
// requests the guest makes of the host (which owns the API objects)
// through files in the shared directory.
package switchguest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The world: one node (the guest's netns.NewNode, its client link at
// NodeIP), pods a, b and c in that order (so at PodIPs), Services web (all
// three), steady (a and b) and ext (a and b, with an externalIP).
const (
	Namespace = "switch"
	NodeName  = "node1"
	PodPort   = 8080
	HeldPort  = 9090
)

var (
	NodeIP     = netip.MustParseAddr("192.168.77.1") // netns.Node.LinkIP once a client is added
	WebVIP     = netip.MustParseAddr("10.96.100.10")
	SteadyVIP  = netip.MustParseAddr("10.96.100.11")
	ExtVIP     = netip.MustParseAddr("10.96.100.12")
	ExternalIP = netip.MustParseAddr("203.0.113.10")
	PodIPs     = map[string]netip.Addr{
		"a": netip.MustParseAddr("10.244.0.2"), "b": netip.MustParseAddr("10.244.0.3"), "c": netip.MustParseAddr("10.244.0.4"),
	}
)

// Setup is setup.json in the shared directory.
type Setup struct {
	KubeProxy string // the kube-proxy binary (readable in the guest); empty when the guest runs none
	EdgeProxy string // the edgeproxy binary, copied into the shared directory
	APIPort   int    // the API server's port on the host's loopback (10.0.2.2 from the guest)
}

// Request is what the guest asks of the host: "delete" or "add" a pod.
// The guest writes req-<n>.json; the host answers with req-<n>.done,
// empty or holding the error.
type Request struct {
	Op  string
	Pod string
}

// Serve answers the guest's requests in order, with do, until ctx ends.
func Serve(ctx context.Context, dir string, do func(Request) error) {
	for n := 1; ctx.Err() == nil; {
		b, err := os.ReadFile(filepath.Join(dir, "req-"+strconv.Itoa(n)+".json"))
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		var r Request
		if err = json.Unmarshal(b, &r); err == nil {
			err = do(r)
		}
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		_ = os.WriteFile(filepath.Join(dir, "req-"+strconv.Itoa(n)+".tmp"), []byte(msg), 0o644)
		_ = os.Rename(filepath.Join(dir, "req-"+strconv.Itoa(n)+".tmp"), filepath.Join(dir, "req-"+strconv.Itoa(n)+".done"))
		n++
	}
}

// ask sends request number n and waits for its answer, at most d.
func ask(dir string, n int, r Request, d time.Duration) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	base := filepath.Join(dir, "req-"+strconv.Itoa(n))
	if err := os.WriteFile(base+".part", b, 0o644); err != nil {
		return err
	}
	if err := os.Rename(base+".part", base+".json"); err != nil {
		return err
	}
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		out, err := os.ReadFile(base + ".done")
		if err != nil {
			continue
		}
		if len(out) > 0 {
			return fmt.Errorf("host: %s pod %s: %s", r.Op, r.Pod, out)
		}
		return nil
	}
	return fmt.Errorf("host did not answer %s pod %s within %s", r.Op, r.Pod, d)
}

// DeletePod deletes pod name at once (no kubelet finishes a graceful
// deletion here) and waits until it is gone, from the API and from every
// EndpointSlice: a proxy started before the EndpointSlice controller drops
// it is right to send traffic to it.
func DeletePod(ctx context.Context, client kubernetes.Interface, ns, name string) error {
	zero := int64(0)
	pods := client.CoreV1().Pods(ns)
	if err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		return err
	}
	var last error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if _, err := pods.Get(ctx, name, metav1.GetOptions{}); err == nil {
			last = fmt.Errorf("pod %s still exists", name)
			continue
		}
		slices, err := client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			last = err
			continue
		}
		last = nil
		for _, s := range slices.Items {
			for _, e := range s.Endpoints {
				if e.TargetRef != nil && e.TargetRef.Name == name {
					last = fmt.Errorf("EndpointSlice %s still lists pod %s", s.Name, name)
				}
			}
		}
		if last == nil {
			return nil
		}
	}
	return errors.Join(errors.New("pod not gone within 30s"), last)
}
