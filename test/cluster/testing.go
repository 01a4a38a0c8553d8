package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
)

// tailLines is how much of each log a failed test prints.
const tailLines = 15

// New starts a cluster for t alone (use it when the test stops or restarts
// parts of it) and stops it when t ends. It skips t (gate.Skip) when the
// binaries are not built, and prints the tail of every log when t failed.
func New(t testing.TB, opts Options) *Cluster {
	t.Helper()
	requireBinaries(t)
	start := time.Now()
	c, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatalf("start cluster: %v", err)
	}
	t.Logf("cluster ready in %s at %s (dir %s)", time.Since(start).Round(time.Millisecond), c.URL, c.Dir)
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.LogTails(tailLines))
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stop cluster: %v", err)
		}
	})
	return c
}

// shared is the package-wide cluster behind Shared and RunShared.
var shared struct {
	mu      sync.Mutex
	managed bool // RunShared is in charge
	tried   bool
	c       *Cluster
	err     error
}

// RunShared runs m and then stops the cluster Shared started, if any. Call
// it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(cluster.RunShared(m)) }
//
// The cluster starts on the first Shared call, so a package whose tests all
// skip starts nothing.
func RunShared(m *testing.M) int {
	shared.mu.Lock()
	shared.managed = true
	shared.mu.Unlock()

	code := m.Run()

	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.c != nil {
		if err := shared.c.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stop shared cluster: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
		shared.c = nil
	}
	return code
}

// Shared returns the package's shared cluster, starting it on first use
// with default Options. TestMain must call RunShared. Tests on a shared
// cluster must not stop its parts, should work in their own namespace
// (Namespace), and must expect other tests' objects elsewhere. When t fails,
// the tail of every log is printed.
func Shared(t testing.TB) *Cluster {
	t.Helper()
	requireBinaries(t)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.managed {
		t.Fatal("cluster.Shared needs TestMain to call cluster.RunShared(m)")
	}
	if !shared.tried {
		shared.tried = true
		start := time.Now()
		shared.c, shared.err = Start(context.Background(), Options{})
		if shared.err == nil {
			t.Logf("shared cluster ready in %s at %s (dir %s)", time.Since(start).Round(time.Millisecond), shared.c.URL, shared.c.Dir)
		}
	}
	if shared.err != nil {
		t.Fatalf("start shared cluster: %v", shared.err)
	}
	c := shared.c
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.LogTails(tailLines))
		}
	})
	return c
}

var namespaceSeq atomic.Uint64

// Namespace creates a namespace (with its default ServiceAccount) named
// after t and returns its name. When t ends, the Services, Pods and
// EndpointSlices in it are deleted; the namespace itself stays, because no
// namespace controller runs to finish deleting it.
func (c *Cluster) Namespace(t testing.TB) string {
	t.Helper()
	ns := namespaceName(t.Name(), namespaceSeq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.emptyNamespace(ctx, ns); err != nil {
			t.Errorf("empty namespace %s: %v", ns, err)
		}
	})
	return ns
}

// emptyNamespace deletes what tests create in ns. Pods go at once (grace
// 0): without a kubelet a graceful delete would leave them terminating.
func (c *Cluster) emptyNamespace(ctx context.Context, ns string) error {
	zero := int64(0)
	all := metav1.ListOptions{}
	errs := []error{
		c.client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, all),
		c.client.DiscoveryV1().EndpointSlices(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, all),
	}
	// Services have no delete-collection verb.
	svcs, err := c.client.CoreV1().Services(ns).List(ctx, all)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, s := range svcs.Items {
		err := c.client.CoreV1().Services(ns).Delete(ctx, s.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// namespaceName turns a test name into a DNS label: lower-case letters,
// digits and '-', at most 63 characters, ending in a sequence number.
func namespaceName(test string, seq uint64) string {
	var b strings.Builder
	for _, r := range strings.ToLower(test) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	base := strings.Trim(b.String(), "-")
	if len(base) > 50 {
		base = strings.TrimRight(base[:50], "-")
	}
	if base == "" {
		base = "test"
	}
	return fmt.Sprintf("%s-%d", base, seq)
}

// requireBinaries skips t (or fails it, when skips are forbidden) unless
// the control-plane binaries are built.
func requireBinaries(t testing.TB) {
	t.Helper()
	if _, err := BinDir(); err != nil {
		if errors.Is(err, ErrNotBuilt) {
			gate.Skip(t, err.Error())
			return
		}
		t.Fatal(err)
	}
}
