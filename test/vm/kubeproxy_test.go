package vm_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/edgeproxy/edgeproxy/internal/testkit/gate"
	"github.com/edgeproxy/edgeproxy/internal/testkit/vm"
	"github.com/edgeproxy/edgeproxy/test/cluster"
)

// kubeProxyScript runs upstream kube-proxy in IPVS mode in the guest
// against the host's API server, waits until its first sync of every IP
// family is done (kubeproxy_sync_proxy_rules_duration_seconds counts it),
// checks with ipvsadm that every real server is in the kernel, records the
// metrics, lets the host change one endpoint and records them again. It
// polls the metrics, not ipvsadm: a dump of 20k real servers every second
// would compete with kube-proxy for the guest's one emulated CPU.
const kubeProxyScript = `
set -u
now() { cut -d" " -f1 /proc/uptime; }
for b in ipvsadm socat; do command -v $b >/dev/null || { echo "guest lacks $b"; exit 3; }; done
socat TCP-LISTEN:$EP_PORT,bind=127.0.0.1,fork,reuseaddr TCP:10.0.2.2:$EP_PORT &
SOCAT=$!
echo "start $(now)"
"$EP_KUBE_PROXY" --proxy-mode=ipvs --kubeconfig=kubeconfig --hostname-override=bench-node \
	--cluster-cidr=$EP_CLUSTER_CIDR --conntrack-max-per-core=0 --v=4 >kube-proxy.log 2>&1 &
KP=$!
metrics() { busybox wget -qO- http://127.0.0.1:10249/metrics 2>/dev/null | grep '^kubeproxy_sync' | grep -v _bucket; }
syncs() { metrics | awk -v f="$1" '$1 == "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"" f "\"}" {print $2}'; }
synced() { for f in $EP_FAMILIES; do [ -n "$(syncs $f)" ] || return 1; done; }
reals() { ipvsadm -Ln | grep -c Masq; }
i=0
while ! synced && [ $i -lt $EP_WAIT ]; do
	kill -0 $KP 2>/dev/null || { echo "kube-proxy exited"; exit 4; }
	sleep 2; i=$((i+2))
done
echo "first-sync-done $(now)"
metrics >metrics-full.txt
n=$(reals)
echo "real-servers $n of $EP_REALS $(now)"
touch synced
i=0
while [ ! -e patched ] && [ $i -lt 600 ]; do sleep 1; i=$((i+1)); done
wc -l <kube-proxy.log >patched-line
c=$(syncs IPv4)
echo "patched $(now)"
i=0
while ! ipvsadm -Ln | grep -q 10.250.0.1:8080 && [ $i -lt 900 ]; do sleep 1; i=$((i+1)); done
echo "change-programmed $(now)"
i=0
while [ "$(syncs IPv4)" = "$c" ] && [ $i -lt 300 ]; do sleep 1; i=$((i+1)); done
metrics >metrics-change.txt
kill $KP $SOCAT
wait
`

// TestKubeProxyIPVSBaseline measures upstream kube-proxy v1.36.3 in IPVS
// mode programming n services x 10 endpoints in the VM, IPv4 and
// dual-stack (each service with an IPv4 and an IPv6 ClusterIP and slice),
// and its sync after one endpoint changed: the baseline for
// ipvs.BenchmarkApply. One boot per case; the sizes are
// EDGEPROXY_VM_BENCH_SERVICES (comma-separated, default 1000). Opt-in
// (EDGEPROXY_VM_BENCH=1); needs test/cluster's binaries (build.sh), and
// ipvsadm and socat in the guest (test/deps.sh). It asserts that every
// real server got programmed, never how fast.
func TestKubeProxyIPVSBaseline(t *testing.T) {
	if os.Getenv("EDGEPROXY_VM_BENCH") != "1" {
		t.Skip("opt-in: set EDGEPROXY_VM_BENCH=1")
	}
	if err := vm.Check(); err != nil {
		t.Skip(err)
	}
	gate.Binaries(t, "ipvsadm", "socat")
	kp, err := cluster.BinPath(cluster.KubeProxyBinary)
	if err != nil {
		t.Skip(err)
	}
	sizes := []int{1000}
	if s := os.Getenv("EDGEPROXY_VM_BENCH_SERVICES"); s != "" {
		sizes = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 || n > 4000 {
				t.Fatalf("EDGEPROXY_VM_BENCH_SERVICES=%q: want sizes from 1 to 4000", s)
			}
			sizes = append(sizes, n)
		}
	}
	for _, dual := range []bool{false, true} {
		for _, n := range sizes {
			t.Run(fmt.Sprintf("%s/services=%d", stackName(dual), n), func(t *testing.T) { kubeProxyBaseline(t, kp, n, dual) })
		}
	}
}

func stackName(dual bool) string { return map[bool]string{false: "ipv4", true: "dual"}[dual] }

// kubeProxyBaseline is one case of TestKubeProxyIPVSBaseline: its own API
// server (dual-stack service CIDR for dual) and its own boot.
func kubeProxyBaseline(t *testing.T, kp string, services int, dual bool) {
	opts := cluster.Options{ExtraSANs: []string{"10.0.2.2"}}
	families, clusterCIDR := []string{"IPv4"}, "10.244.0.0/16"
	if dual {
		opts.ServiceCIDR = "10.96.0.0/16,fd00:96::/112"
		families, clusterCIDR = []string{"IPv4", "IPv6"}, "10.244.0.0/16,fd00:244::/64"
	}
	c := cluster.New(t, opts)
	// A full sync of 1k services under TCG has taken over 5 minutes per
	// family; the bound leaves room for a loaded host.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	cfg := c.RESTConfig()
	cfg.QPS, cfg.Burst = 1000, 2000
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateNode(ctx, "bench-node", "zone-a", "10.0.2.15"); err != nil {
		t.Fatal(err)
	}
	const ns = "bench"
	if err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := createServices(ctx, client, ns, services, dual); err != nil {
		t.Fatal(err)
	}
	t.Logf("created %d services and their slices in %s", services, time.Since(start).Round(time.Millisecond))

	dir := t.TempDir()
	if err := c.WriteKubeconfig(filepath.Join(dir, "kubeconfig"), fmt.Sprintf("https://127.0.0.1:%d", c.Port())); err != nil {
		t.Fatal(err)
	}
	// The host's half: once the guest reports the first sync done, change
	// one endpoint of one service.
	var wg sync.WaitGroup
	var patchErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			if _, err := os.Stat(filepath.Join(dir, "synced")); err == nil {
				patchErr = changeOneEndpoint(ctx, client, ns, services/2)
				os.WriteFile(filepath.Join(dir, "patched"), nil, 0o644)
				return
			}
			time.Sleep(500 * time.Millisecond)
		}
	}()
	reals := services * 10 * len(families)
	res, err := vm.Run(ctx, vm.Options{Dir: dir, Script: kubeProxyScript, Timeout: 55 * time.Minute, Env: []string{
		"EP_PORT=" + strconv.Itoa(c.Port()), "EP_KUBE_PROXY=" + kp, "EP_REALS=" + strconv.Itoa(reals),
		"EP_FAMILIES=" + strings.Join(families, " "), "EP_CLUSTER_CIDR=" + clusterCIDR, "EP_WAIT=2700"}})
	cancel()
	wg.Wait()
	log, _ := os.ReadFile(filepath.Join(dir, "kube-proxy.log"))
	if res != nil {
		t.Logf("guest output (times are guest uptime):\n%s", res.Output)
	}
	if err != nil {
		t.Fatalf("%v\nkube-proxy log tail:\n%s", err, log[max(0, len(log)-3000):])
	}
	if patchErr != nil {
		t.Fatal(patchErr)
	}
	kubeProxyReport(t, dir, string(log), services, reals, families)
}

var (
	syncLine   = regexp.MustCompile(`"syncProxyRules complete".*ipFamily="(IPv[46])".*elapsed="([^"]+)"`)
	realsLine  = regexp.MustCompile(`(?m)^real-servers (\d+) of (\d+)`)
	guestTime  = regexp.MustCompile(`(?m)^(start|first-sync-done|patched|change-programmed) ([0-9.]+)`)
	metricSync = "kubeproxy_sync_proxy_rules_duration_seconds"
)

// kubeProxyReport logs kube-proxy's sync times from its log (each
// "syncProxyRules complete" with its elapsed time, the first per family
// being the full sync) and metrics, and fails when not every real server
// was programmed or no sync followed the change.
func kubeProxyReport(t *testing.T, dir, log string, services, reals int, families []string) {
	out, _ := os.ReadFile(filepath.Join(dir, ".vm", "output"))
	if m := realsLine.FindStringSubmatch(string(out)); m == nil || m[1] != strconv.Itoa(reals) {
		t.Errorf("after the first sync of each family ipvsadm -Ln showed %v real servers, want %d", m, reals)
	}
	at := map[string]float64{}
	for _, m := range guestTime.FindAllStringSubmatch(string(out), -1) {
		at[m[1]], _ = strconv.ParseFloat(m[2], 64)
	}
	t.Logf("kube-proxy ipvs, %d services x 10 endpoints (%s): %.1fs from its start until the first sync of every family was done; the change in the kernel %.1fs after the host made it",
		services, stackName(len(families) == 2), at["first-sync-done"]-at["start"], at["change-programmed"]-at["patched"])
	patchedAt := -1
	if b, err := os.ReadFile(filepath.Join(dir, "patched-line")); err == nil {
		patchedAt, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	first := map[string]string{}
	for i, line := range strings.Split(log, "\n") {
		m := syncLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		when := "before the change"
		if patchedAt >= 0 && i >= patchedAt {
			when = "after the change"
		}
		if _, ok := first[m[1]]; !ok {
			first[m[1]] = m[2]
			when = "first (full) sync"
		}
		t.Logf("kube-proxy %s sync, %s: %s", m[1], when, m[2])
	}
	full := readMetrics(t, filepath.Join(dir, "metrics-full.txt"))
	change := readMetrics(t, filepath.Join(dir, "metrics-change.txt"))
	for _, f := range families {
		l := `{ip_family="` + f + `"}`
		n1, s1 := full[metricSync+"_count"+l], full[metricSync+"_sum"+l]
		n2, s2 := change[metricSync+"_count"+l], change[metricSync+"_sum"+l]
		t.Logf("kube-proxy ipvs %s, %d services x 10 endpoints (%s): first sync %s; %v syncs, %.2fs in total, when the first sync of every family was done",
			f, services, stackName(len(families) == 2), first[f], n1, s1)
		if n2 > n1 {
			t.Logf("kube-proxy ipvs %s, after one endpoint changed: %v syncs, %.3fs each on average", f, n2-n1, (s2-s1)/(n2-n1))
		}
	}
	l := `{ip_family="IPv4"}`
	if full[metricSync+"_count"+l] == 0 || change[metricSync+"_count"+l] <= full[metricSync+"_count"+l] {
		t.Errorf("kube-proxy reported no IPv4 sync after the change; log tail:\n%s", log[max(0, len(log)-3000):])
	}
}

func readMetrics(t *testing.T, path string) map[string]float64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 {
			v, err := strconv.ParseFloat(f[1], 64)
			if err == nil {
				out[f[0]] = v
			}
		}
	}
	return out
}

func sliceName(i int) string { return fmt.Sprintf("svc-%05d", i) }

// createServices creates n selector-less ClusterIP services, each with an
// EndpointSlice of 10 ready endpoints (dual: also an IPv6 ClusterIP and an
// IPv6 slice of 10), with 8 workers.
func createServices(ctx context.Context, client kubernetes.Interface, ns string, n int, dual bool) error {
	work := make(chan int)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := createService(ctx, client, ns, i, dual); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for i := range n {
		select {
		case work <- i:
		case err := <-errs:
			close(work)
			wg.Wait()
			return err
		}
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

func createService(ctx context.Context, client kubernetes.Interface, ns string, i int, dual bool) error {
	name := sliceName(i)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
	if dual {
		policy := corev1.IPFamilyPolicyRequireDualStack
		svc.Spec.IPFamilyPolicy = &policy
		svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	}
	if _, err := client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create service %s: %w", name, err)
	}
	if err := createSlice(ctx, client, ns, name, name, discoveryv1.AddressTypeIPv4, func(e int) string {
		return fmt.Sprintf("10.%d.%d.%d", 200+e, i>>8, i&255)
	}); err != nil {
		return err
	}
	if !dual {
		return nil
	}
	return createSlice(ctx, client, ns, name, name+"-v6", discoveryv1.AddressTypeIPv6, func(e int) string {
		return netip.AddrFrom16([16]byte{0xfd, 0, 2, 0, 4: byte(e), 14: byte(i >> 8), 15: byte(i)}).String()
	})
}

// createSlice creates one EndpointSlice of service svc with 10 ready
// endpoints on port 8080, addr(0..9).
func createSlice(ctx context.Context, client kubernetes.Interface, ns, svc, name string, at discoveryv1.AddressType, addr func(int) string) error {
	ready := true
	port, pname, proto := int32(8080), "http", corev1.ProtocolTCP
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			discoveryv1.LabelServiceName: svc,
			discoveryv1.LabelManagedBy:   "edgeproxy-bench",
		}},
		AddressType: at,
		Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
	}
	for e := range 10 {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{addr(e)},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
		})
	}
	if _, err := client.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create endpointslice %s: %w", name, err)
	}
	return nil
}

func changeOneEndpoint(ctx context.Context, client kubernetes.Interface, ns string, i int) error {
	es, err := client.DiscoveryV1().EndpointSlices(ns).Get(ctx, sliceName(i), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get endpointslice: %w", err)
	}
	es.Endpoints[0].Addresses = []string{"10.250.0.1"}
	if _, err := client.DiscoveryV1().EndpointSlices(ns).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update endpointslice: %w", err)
	}
	return nil
}
