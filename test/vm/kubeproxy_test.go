package vm_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/edgeproxy/edgeproxy/internal/testkit/vm"
	"github.com/edgeproxy/edgeproxy/test/cluster"
)

// kubeProxyScript runs upstream kube-proxy in IPVS mode in the guest
// against the host's API server, waits until it has programmed every
// service, records its sync metrics, lets the host change one endpoint and
// records them again.
const kubeProxyScript = `
set -u
now() { cut -d" " -f1 /proc/uptime; }
socat TCP-LISTEN:$EP_PORT,bind=127.0.0.1,fork,reuseaddr TCP:10.0.2.2:$EP_PORT &
SOCAT=$!
echo "start $(now)"
"$EP_KUBE_PROXY" --proxy-mode=ipvs --kubeconfig=kubeconfig --hostname-override=bench-node \
	--cluster-cidr=10.244.0.0/16 --conntrack-max-per-core=0 --v=4 >kube-proxy.log 2>&1 &
KP=$!
metrics() { busybox wget -qO- http://127.0.0.1:10249/metrics | grep '^kubeproxy_sync' | grep -v _bucket; }
syncs() { metrics | awk '$1 ~ /^kubeproxy_sync_proxy_rules_duration_seconds_count.*IPv4/ {print $2}'; }
want=$((EP_SERVICES * 10))
i=0
while [ $i -lt 1800 ]; do
	n=$(ipvsadm -Ln | grep -c Masq)
	[ "$n" -ge "$want" ] && break
	sleep 1; i=$((i+1))
done
echo "real-servers $n $(now)"
i=0
while [ -z "$(syncs)" ] && [ $i -lt 1800 ]; do sleep 1; i=$((i+1)); done
echo "first-sync-done $(now)"
metrics >metrics-full.txt
touch synced
i=0
while [ ! -e patched ] && [ $i -lt 600 ]; do sleep 1; i=$((i+1)); done
echo "patched $(now)"
i=0
while ! ipvsadm -Ln | grep -q 10.250.0.1:8080 && [ $i -lt 900 ]; do sleep 1; i=$((i+1)); done
echo "change-programmed $(now)"
c=$(syncs)
i=0
while [ "$(syncs)" = "$c" ] && [ $i -lt 300 ]; do sleep 1; i=$((i+1)); done
metrics >metrics-change.txt
kill $KP $SOCAT
wait
`

// TestKubeProxyIPVSBaseline measures upstream kube-proxy v1.36.3 in IPVS
// mode programming 1000 services x 10 endpoints in the VM, and its sync
// after one endpoint changed: the baseline for ipvs.BenchmarkApply. Opt-in
// (EDGEPROXY_VM_BENCH=1); needs test/cluster's binaries (build.sh).
func TestKubeProxyIPVSBaseline(t *testing.T) {
	if os.Getenv("EDGEPROXY_VM_BENCH") != "1" {
		t.Skip("opt-in: set EDGEPROXY_VM_BENCH=1")
	}
	if err := vm.Check(); err != nil {
		t.Skip(err)
	}
	const services = 1000
	kp, err := cluster.BinPath(cluster.KubeProxyBinary)
	if err != nil {
		t.Skip(err)
	}
	c := cluster.New(t, cluster.Options{ExtraSANs: []string{"10.0.2.2"}})
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
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
	if err := createServices(ctx, client, ns, services); err != nil {
		t.Fatal(err)
	}
	t.Logf("created %d services and slices in %s", services, time.Since(start).Round(time.Millisecond))

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
	res, err := vm.Run(ctx, vm.Options{Dir: dir, Script: kubeProxyScript, Timeout: 35 * time.Minute, Env: []string{
		"EP_PORT=" + strconv.Itoa(c.Port()), "EP_KUBE_PROXY=" + kp, "EP_SERVICES=" + strconv.Itoa(services)}})
	cancel()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if patchErr != nil {
		t.Fatal(patchErr)
	}
	log, _ := os.ReadFile(filepath.Join(dir, "kube-proxy.log"))
	t.Logf("guest output (times are guest uptime):\n%s", res.Output)
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, "syncProxyRules complete") && strings.Contains(line, "IPv4") {
			t.Log(line)
		}
	}
	full := readMetrics(t, filepath.Join(dir, "metrics-full.txt"))
	change := readMetrics(t, filepath.Join(dir, "metrics-change.txt"))
	const m, l = "kubeproxy_sync_proxy_rules_duration_seconds", `{ip_family="IPv4"}`
	n1, s1 := full[m+"_count"+l], full[m+"_sum"+l]
	n2, s2 := change[m+"_count"+l], change[m+"_sum"+l]
	if n1 == 0 || n2 <= n1 {
		t.Fatalf("kube-proxy reported no syncs (%v, %v); log tail:\n%s", n1, n2, log[max(0, len(log)-3000):])
	}
	t.Logf("kube-proxy ipvs, %d services x 10 endpoints: %v syncs taking %.2fs in total until all were programmed (first full sync included)", services, n1, s1)
	t.Logf("kube-proxy ipvs, after one endpoint changed: %v syncs, %.3fs each on average", n2-n1, (s2-s1)/(n2-n1))
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
// EndpointSlice of 10 ready endpoints, with 8 workers.
func createServices(ctx context.Context, client kubernetes.Interface, ns string, n int) error {
	work := make(chan int)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := createService(ctx, client, ns, i); err != nil {
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

func createService(ctx context.Context, client kubernetes.Interface, ns string, i int) error {
	name := sliceName(i)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
	if _, err := client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create service %s: %w", name, err)
	}
	ready := true
	port, pname, proto := int32(8080), "http", corev1.ProtocolTCP
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			discoveryv1.LabelServiceName: name,
			discoveryv1.LabelManagedBy:   "edgeproxy-bench",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
	}
	for e := range 10 {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 200+e, i>>8, i&255)},
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
