package conformance

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/vm"
	"github.com/edgeproxy/edgeproxy/test/agenttest"
	"github.com/edgeproxy/edgeproxy/test/cluster"
)

// The IPVS matrix runs in the qemu VM (the host kernel has no IPVS), split
// in two halves. On the host, TestMatrixIPVS starts the control plane
// (TCG is too slow for it), creates the world's API objects and boots the
// VM with this package's test binary. In the guest, TestMatrixIPVSGuest
// builds the namespaces, runs kube-proxy and edgeproxy in IPVS mode one at
// a time, probes every cell, prints the matrix and judges it; its result
// is the host test's. The guest reaches the API server through qemu's
// user network (the host's loopback is 10.0.2.2 there).

// vmShared is the directory the host hands the guest (read-only there):
// guest.json, the kubeconfig and a copy of the edgeproxy binary.
var vmShared = flag.String("conformance.vm", "", "run TestMatrixIPVSGuest with the host's world in this directory")

// guestSetup is guest.json.
type guestSetup struct {
	KubeProxy string // kube-proxy binary
	EdgeProxy string // edgeproxy binary
	APIPort   int    // the API server's port on the host's loopback
	Seed      int    // where the proxies' run order starts (orderSeed)
}

// vmTimeout bounds the VM run, boot included: 7-8 minutes on a busy
// two-core machine, over 12 at a load of 50 (other VMs on the same cores).
const vmTimeout = 20 * time.Minute

func TestMatrixIPVS(t *testing.T) {
	gate.Root(t)
	if err := vm.Check(); err != nil {
		gate.Skip(t, err.Error())
	}
	kp, err := cluster.BinPath(cluster.KubeProxyBinary)
	if err != nil {
		gate.Skip(t, err.Error())
	}
	dir := sharedDir(t)
	ep := filepath.Join(dir, "edgeproxy")
	if err := vm.CopyBinary(agenttest.Binary(t), ep); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), vmTimeout+5*time.Minute)
	defer cancel()
	start := time.Now()
	c := cluster.New(t, cluster.Options{ServiceCIDR: serviceCIDR, ExtraSANs: []string{"10.0.2.2"}})
	w := &World{t: t, Cluster: c, Client: c.Client(), Services: map[string]*corev1.Service{}, names: map[netip.Addr]string{}}
	if err := w.populate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("API objects ready in %s", time.Since(start).Round(time.Millisecond))
	if err := c.WriteKubeconfig(filepath.Join(dir, "kubeconfig"), fmt.Sprintf("https://127.0.0.1:%d", c.Port())); err != nil {
		t.Fatal(err)
	}
	setup, err := json.Marshal(guestSetup{KubeProxy: kp, EdgeProxy: ep, APIPort: c.Port(), Seed: orderSeed(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "guest.json"), setup, 0o644); err != nil {
		t.Fatal(err)
	}
	vm.RunGoTests(t, vmTimeout, vm.GoTest{Package: "./test/conformance",
		Args:  []string{"-test.run=^TestMatrixIPVSGuest$", "-conformance.vm=" + dir},
		Check: guestPrintedMatrix})
	t.Logf("IPVS matrix: %s in all (VM boot included)", time.Since(start).Round(time.Second))
}

// guestPrintedMatrix checks the guest's output: the guest test ran and
// passed (not skipped, not left out by -test.run) and its matrix has every
// IPVS cell. The guest's exit status alone says none of that.
func guestPrintedMatrix(out []byte) error {
	text := string(out)
	if !strings.Contains(text, "--- PASS: TestMatrixIPVSGuest ") {
		return fmt.Errorf("TestMatrixIPVSGuest did not run and pass in the guest")
	}
	want := CellCount[BackendIPVS]
	summary := regexp.MustCompile(`(?m)^(\d+) cells \(ipvs (\d+)\): `).FindStringSubmatch(text)
	if summary == nil {
		return fmt.Errorf("the guest printed no matrix summary")
	}
	if summary[1] != strconv.Itoa(want) || summary[2] != strconv.Itoa(want) {
		return fmt.Errorf("the guest's matrix has %s cells (ipvs %s), want %d", summary[1], summary[2], want)
	}
	return nil
}

// sharedDir is a fresh directory the guest can read: not under /tmp,
// /run or /var, which are the guest's own tmpfs.
func sharedDir(t *testing.T) string {
	t.Helper()
	base, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	base = filepath.Join(base, "edgeproxy")
	for _, p := range []string{"/tmp", "/run", "/var", "/dev/shm"} {
		if strings.HasPrefix(base+"/", p+"/") {
			gate.Skip(t, "the user cache directory "+base+" is not visible in the VM (set XDG_CACHE_HOME)")
		}
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(base, "conformance-ipvs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestMatrixIPVSGuest is the guest's half of TestMatrixIPVS.
func TestMatrixIPVSGuest(t *testing.T) {
	vm.Guest(t)
	if *vmShared == "" {
		t.Skip("started by TestMatrixIPVS, with -conformance.vm")
	}
	b, err := os.ReadFile(filepath.Join(*vmShared, "guest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var setup guestSetup
	if err := json.Unmarshal(b, &setup); err != nil {
		t.Fatalf("guest.json: %v", err)
	}
	diffs := readRules(t, "DIFFERENCES.md")
	bugs := readRules(t, "KNOWN_BUGS.md")
	ctx, cancel := context.WithTimeout(context.Background(), vmTimeout)
	defer cancel()

	start := time.Now()
	w := newNet(t)
	// IPVS schedules round robin, and cells that share a virtual server run
	// one after another: two answers show both of two endpoints. The
	// probe bound matters for cells where fewer endpoints can answer than
	// the Service selects (iTP/eTP Local), which use every probe: under
	// TCG each costs tens of milliseconds.
	w.probes = 12
	// TCG is slow: an answer can take more than probeTimeout without
	// anything being dropped. A stall is not hidden by it: every probe
	// has a source port of its own (send), so IPVS never meets a tuple it
	// still holds (it drops the first SYN of a reused one), and a SYN
	// dropped for any reason is resent after 1 s, which the probe sees
	// (syn-resent) however soon the answer comes after it.
	w.timeout = 3 * time.Second
	// The kubeconfig names https://127.0.0.1:<port>: served in the test's
	// namespace and in the node's by a relay to the host.
	vm.RelayToHost(t, nil, setup.APIPort)
	vm.RelayToHost(t, w.Node.NS, setup.APIPort)
	w.Kubeconfig = filepath.Join(*vmShared, "kubeconfig")
	cfg, err := clientcmd.BuildConfigFromFlags("", w.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if w.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	for _, s := range Shapes {
		svc, err := w.Client.CoreV1().Services(s.ns()).Get(ctx, s.svcName(), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("service %s: %v", s.Name, err)
		}
		w.Services[s.Name] = svc
	}
	w.nameServices()
	t.Logf("world ready in %s", time.Since(start).Round(time.Millisecond))
	t.Logf("proxy order: seed %d from the host; %s first", setup.Seed, runOrder(setup.Seed)[0])
	rows := w.matrix(ctx, t, Binaries{KubeProxy: setup.KubeProxy, EdgeProxy: setup.EdgeProxy}, BackendIPVS, setup.Seed)
	report(t, rows, diffs, bugs)
	t.Logf("IPVS matrix: %d cells in %s", len(rows), time.Since(start).Round(time.Second))
}

func TestGuestPrintedMatrix(t *testing.T) {
	n := CellCount[BackendIPVS]
	full := fmt.Sprintf("=== RUN   TestMatrixIPVSGuest\n%d cells (ipvs %d): %d ✔ same, 0 ≈ listed in DIFFERENCES.md, 0 ! listed in KNOWN_BUGS.md, 0 ✘ failed\n--- PASS: TestMatrixIPVSGuest (301.20s)\nPASS\n", n, n, n)
	if err := guestPrintedMatrix([]byte(full)); err != nil {
		t.Errorf("a whole matrix: %v", err)
	}
	for name, out := range map[string]string{
		"skipped":       "=== RUN   TestMatrixIPVSGuest\n    ipvs_test.go:1: started by TestMatrixIPVS, with -conformance.vm\n--- SKIP: TestMatrixIPVSGuest (0.00s)\nPASS\n",
		"no test ran":   "testing: warning: no tests to run\nPASS\n",
		"cells missing": strings.Replace(full, fmt.Sprintf("%d cells (ipvs %d)", n, n), fmt.Sprintf("%d cells (ipvs %d)", n-29, n-29), 1),
		"no summary":    "=== RUN   TestMatrixIPVSGuest\n--- PASS: TestMatrixIPVSGuest (301.20s)\nPASS\n",
	} {
		if err := guestPrintedMatrix([]byte(out)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
