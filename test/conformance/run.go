package conformance

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/edgeproxy/edgeproxy/test/cluster"
	"github.com/edgeproxy/edgeproxy/test/proxies"
)

// Binaries are the proxies under test.
type Binaries struct {
	KubeProxy, EdgeProxy string
}

// parallel is how many cells are probed at once. Cells of one run cannot
// interfere: each probe is its own flow, and no cell changes the world
// (the change cells, which do, run after the others). Cells that
// send to the same address do run one after the other: IPVS's round robin
// is one sequence per virtual server, and two clients in lockstep on it
// would each see one endpoint only.
const parallel = 32

// settings for a profile; the same for both proxies. BackendIPVS is IPVS
// mode with iptables-nft, BackendNFTables nftables mode (with iptables-nft
// in PATH, which kube-proxy cleans the other modes' rules up with).
func settings(profile, backend string) proxies.Settings {
	s := proxies.Settings{Backend: backend, MinSync: time.Second, Sync: 30 * time.Second,
		ClusterCIDR: ClusterCIDR, ExternalIPs: true}
	switch backend {
	case BackendIPVS:
		s.Mode, s.Backend = proxies.ModeIPVS, "nft"
	case BackendNFTables:
		s.Mode, s.Backend = proxies.ModeNFTables, "nft"
	}
	switch profile {
	case ProfileNPA:
		s.NodePortAddresses = []string{extNet4.String()}
	case ProfilePrimary:
		s.NodePortAddresses = []string{"primary"}
	case ProfileNoIPv6:
		s.ClusterCIDR, _, _ = strings.Cut(ClusterCIDR, ",")
	}
	return s
}

// healthzPort is where either proxy serves /healthz and /livez, on every
// IPv4 address of the node.
const healthzPort = 10256

// metricsAddr is where either proxy serves /metrics in the node namespace.
const metricsAddr = "127.0.0.1:10249"

// proc is a proxy running in the node namespace.
type proc struct {
	*proxies.Process
	kind proxies.Kind
}

// start starts one proxy, alone, in the emptied node namespace.
func (w *World) start(kind proxies.Kind, bins Binaries, s proxies.Settings, dir string) (*proc, error) {
	reset := proxies.Reset(w.Node.Run)
	if s.Mode == proxies.ModeIPVS {
		reset = proxies.ResetIPVS(w.Node.Do, w.Node.Run)
	}
	if reset != nil {
		return nil, reset
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	path, err := proxies.BackendPath(w.Dir, s.Backend)
	if err != nil {
		return nil, err
	}
	node := proxies.Node{Name: NodeName, Kubeconfig: w.Kubeconfig, MetricsAddr: metricsAddr, HealthzAddr: fmt.Sprintf("0.0.0.0:%d", healthzPort)}
	var args []string
	switch kind {
	case proxies.KubeProxy:
		args = append([]string{bins.KubeProxy}, proxies.KubeProxyArgs(node, s)...)
	case proxies.EdgeProxy:
		conf := filepath.Join(dir, "edgeproxy.yaml")
		if err := os.WriteFile(conf, []byte(proxies.EdgeProxyConfig(node, s, filepath.Join(dir, "state"))), 0o600); err != nil {
			return nil, err
		}
		args = []string{bins.EdgeProxy, "run", "--config", conf}
	}
	logPath := filepath.Join(dir, string(kind)+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command("ip", append([]string{"netns", "exec", w.Node.Name}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = proxies.Env(path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &proc{kind: kind}
	if p.Process, err = proxies.Start(string(kind), cmd, logPath); err != nil {
		return nil, err
	}
	return p, nil
}

// tail is the end of the proxy's log.
func (p *proc) tail(n int) string {
	b, _ := os.ReadFile(p.Log)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// errors are the first n distinct error lines of the proxy's log
// (kube-proxy's klog "E" lines, edgeproxy's level=ERROR), with their
// timestamps cut, so that a proxy failing part of each sync shows why.
func (p *proc) errors(n int) []string {
	b, _ := os.ReadFile(p.Log)
	var out []string
	seen := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		var msg string
		switch {
		case len(l) > 22 && l[0] == 'E' && l[5] == ' ':
			msg = l[22:] // "E1124 21:49:05.139059 " then pid and source
		case strings.Contains(l, "level=ERROR"):
			msg = l[strings.Index(l, "level=ERROR"):]
		default:
			continue
		}
		if len(msg) > 400 {
			msg = msg[:400]
		}
		if !seen[msg] && len(out) < n {
			seen[msg] = true
			out = append(out, msg)
		}
	}
	return out
}

// ready waits (bounded) until the proxy has programmed the Services: the
// ClusterIP of "cip" answers in both families, and kube-proxy has
// finished a sync of each family (kubeProxySynced). Both proxies list
// everything before their first sync; a pause of two minimum sync
// periods lets a follow-up sync land. With optional6 (IPVS mode, where
// edgeproxy does not program IPv6 yet) the IPv6 canary is waited for a
// bounded while only: the cells show what is missing.
func (w *World) ready(ctx context.Context, p *proc, optional6 bool) error {
	canaries := []Cell{
		{Shape: shape("cip"), Frontend: FClusterIP, Position: "pod", Family: "v4"},
		{Shape: shape("cip"), Frontend: FClusterIP, Position: "pod", Family: "v6"},
	}
	deadline := time.Now().Add(2 * time.Minute)
	for _, c := range canaries {
		if short := time.Now().Add(20 * time.Second); optional6 && c.Family == "v6" && short.Before(deadline) {
			deadline = short
		}
		for {
			if err := p.Exited(); err != nil {
				return err
			}
			dst, err := w.target(c)
			if err != nil {
				return err
			}
			_, err = w.client(c.Position).TCP(dst, time.Second)
			if err == nil {
				break
			}
			if optional6 && c.Family == "v6" && time.Now().After(deadline) {
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("%s: %s never answered: %v", p.kind, c.Key(), err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	if p.kind == proxies.KubeProxy {
		if err := w.kubeProxySynced(ctx, p); err != nil {
			return err
		}
	}
	time.Sleep(2 * time.Second)
	return p.Exited()
}

// kubeProxySynced waits (bounded) until kube-proxy has finished a sync of
// each IP family. An answering ClusterIP does not show that in IPVS mode:
// there each family's syncProxyRules adds the virtual servers and binds
// their addresses Service by Service, and writes that family's iptables
// rules (masquerade, KUBE-IPVS-FILTER, source ranges, health-check ports)
// only at its end, in one iptables-restore, after which it sets
// kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family}
// (pkg/proxy/ipvs/proxier.go). In the VM the first IPv6 sync ran after
// the IPv4 one and wrote its rules about 24 s after the IPv6 canary
// answered: cells probed meanwhile saw empty ip6tables chains.
func (w *World) kubeProxySynced(ctx context.Context, p *proc) error {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		m, err := w.metrics()
		if err == nil && familiesSynced(m, "IPv4", "IPv6") {
			return nil
		}
		if err := p.Exited(); err != nil {
			return err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s: no finished sync of both IP families in its metrics (last error: %v)", p.kind, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// metrics reads /metrics from metricsAddr in the node namespace.
func (w *World) metrics() (proxies.Metrics, error) {
	var conn net.Conn
	err := w.Node.Do(func() error {
		var err error
		conn, err = (&net.Dialer{Timeout: time.Second}).Dial("tcp", metricsAddr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(conn, "GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n", metricsAddr); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics: status %d", resp.StatusCode)
	}
	return proxies.ParseMetrics(io.LimitReader(resp.Body, 4<<20))
}

// familiesSynced reports whether kube-proxy's metrics show a finished
// sync of every family: a nonzero
// kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="<family>"}.
func familiesSynced(m proxies.Metrics, families ...string) bool {
	for _, f := range families {
		if m.Sum("kubeproxy_sync_proxy_rules_last_timestamp_seconds", `ip_family="`+f+`"`) <= 0 {
			return false
		}
	}
	return true
}

// syncs is what a proxy's metrics say of its finished syncs of one IP
// family (kube-proxy's are labelled by family; edgeproxy's, unlabelled,
// cover both): how many, and how long the longest took at most — the
// smallest bucket of kubeproxy_sync_proxy_rules_duration_seconds that
// holds them all, or, past the last bucket, all of them together.
type syncs struct {
	count   int
	longest time.Duration
}

// parseSyncs reads family's syncs ("IPv4", "IPv6") from a proxy's metrics.
func parseSyncs(m proxies.Metrics, family string) (syncs, error) {
	const name = "kubeproxy_sync_proxy_rules_duration_seconds"
	var labels []string // edgeproxy's series carry no family
	for k := range m.Select(name + "_count") {
		if strings.Contains(k, "ip_family=") {
			labels = []string{`ip_family="` + family + `"`}
		}
	}
	if len(m.Select(name+"_count", labels...)) == 0 {
		return syncs{}, fmt.Errorf("metrics: no %s_count for %s", name, family)
	}
	count := m.Sum(name+"_count", labels...)
	longest := m.Sum(name+"_sum", labels...)
	for _, b := range m.Buckets(name, labels...) {
		if b.N == count && !math.IsInf(b.Le, 1) {
			longest = b.Le
			break
		}
	}
	return syncs{count: int(count), longest: time.Duration(longest * float64(time.Second))}, nil
}

func shape(name string) *Shape {
	for i := range Shapes {
		if Shapes[i].Name == name {
			return &Shapes[i]
		}
	}
	panic("conformance: no shape " + name)
}

// Run runs one proxy on one backend with one profile and probes cells.
func (w *World) Run(ctx context.Context, kind proxies.Kind, bins Binaries, profile, backend string, cells []Cell) (map[string]Outcome, error) {
	dir := filepath.Join(w.Dir, "runs", fmt.Sprintf("%s-%s-%s", kind, backend, profileName(profile)))
	if profile == ProfileNoIPv6 {
		// Before the proxy starts: both decide on IPv6 at start.
		restore, err := w.withoutIPv6()
		if err != nil {
			return nil, err
		}
		defer func() {
			if err := restore(); err != nil {
				w.t.Errorf("%s on %s (%s): %v", kind, backend, profileName(profile), err)
			}
		}()
	}
	var p *proc
	for start := 1; ; start++ {
		var err error
		if p, err = w.start(kind, bins, settings(profile, backend), dir); err != nil {
			return nil, err
		}
		if err := w.ready(ctx, p, backend == BackendIPVS && kind == proxies.EdgeProxy); err != nil {
			p.Stop()
			return nil, fmt.Errorf("%w\n%s", err, p.tail(30))
		}
		if kind != proxies.KubeProxy || !slices.ContainsFunc(cells, isZoneMatch) {
			break
		}
		ok, err := w.zoneKnown(ctx)
		if err != nil || ok {
			break // an error is the cells' to show
		}
		p.Stop()
		if start == kubeProxyStarts {
			return nil, fmt.Errorf("%s ignored its node's zone in %d starts in a row (see zoneKnown)", kind, start)
		}
		w.t.Logf("%s on %s (%s): start %d ignores its node's zone (upstream race, see zoneKnown): started again", kind, backend, profileName(profile), start)
	}
	defer p.Stop()
	out := map[string]Outcome{}
	var mu sync.Mutex
	var changes, drains []Cell
	work := make(chan []Cell)
	var wg sync.WaitGroup
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for group := range work {
				for _, c := range group {
					o := w.Probe(ctx, c)
					mu.Lock()
					out[c.Key()] = o
					mu.Unlock()
				}
			}
		}()
	}
	var order []string
	groups := map[string][]Cell{}
	for _, c := range cells {
		if c.Shape.Change != "" {
			changes = append(changes, c)
			continue
		}
		if draining(c.Frontend) {
			drains = append(drains, c)
			continue
		}
		dst, _ := w.target(c) // an error is the cell's outcome
		k := dst.String() + "/" + string(c.proto())
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], c)
	}
	for _, k := range order {
		work <- groups[k]
	}
	close(work)
	wg.Wait()
	if len(changes) > 0 {
		for k, o := range w.Changes(ctx, changes) {
			out[k] = o
		}
	}
	if len(drains) > 0 {
		for k, o := range w.Drained(ctx, drains) {
			out[k] = o
		}
	}
	if err := p.Exited(); err != nil {
		return out, fmt.Errorf("%w\n%s", err, p.tail(30))
	}
	if errs := p.errors(8); len(errs) > 0 && w.t != nil {
		w.t.Logf("%s on %s (%s) logged errors:\n  %s", kind, backend, profileName(profile), strings.Join(errs, "\n  "))
	}
	return out, nil
}

// kubeProxyStarts bounds the starts of kube-proxy that ignore the zone.
const kubeProxyStarts = 3

func isZoneMatch(c Cell) bool { return c.Shape.Name == "cip-zone-match" }

// zoneKnown reports whether the proxy honours cip-zone-match's zone
// hints: 20 probes of its ClusterIP from the pod reach none of node-b's
// (zone-b) endpoints.
//
// kube-proxy v1.36.3 sometimes never learns its Node's zone: its
// NodeTopologyConfig (pkg/proxy/config/config.go) adds its handler to the
// Node informer, which is already running (the NodeManager started it),
// and only then registers the proxier to be told; when the informer
// replays the Node in between, the zone is stored with nobody to tell,
// and every later event carries the same zone, so the proxier keeps
// treating hints as absent for its whole life. In one run of TestMatrix
// it did (all 8 cip-zone-match cells: l1,r1,z1 where edgeproxy's l1,z1),
// caught by the cell's anchor. The matrix compares Service behaviour, so
// such a start is not judged: Run starts kube-proxy again (logged).
// With hints ignored, each probe reaches r1 one time in three (IPVS
// round robin: within three), so 20 miss it with odds of 3·10⁻⁴, and
// the cells' anchor still stands behind this check.
func (w *World) zoneKnown(ctx context.Context) (bool, error) {
	c := Cell{Shape: shape("cip-zone-match"), Frontend: FClusterIP, Position: "pod", Family: "v4"}
	dst, err := w.target(c)
	if err != nil {
		return false, err
	}
	for range 20 {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		r, _, err := w.send(w.client(c.Position), false, dst, w.timeout)
		if err != nil {
			return false, err
		}
		if nodeZones[remotePods[r.Name]] == "zone-b" {
			return false, nil
		}
	}
	return true, nil
}

func profileName(p string) string {
	if p == "" {
		return "default"
	}
	return p
}

// toBeDeleted is the taint the cluster autoscaler puts on a Node it is
// about to remove: both proxies' /healthz then fail (kube-proxy's
// nodeEligible, KEP-3836) so that load balancers drain the node, while
// /livez stays up.
const toBeDeleted = "ToBeDeletedByClusterAutoscaler"

// draining reports whether a frontend is probed on a draining node.
func draining(fe string) bool { return fe == FHealthzDraining || fe == FLivezDraining }

// Drained probes cells with this node tainted toBeDeleted, after the
// proxy's other cells: it taints the Node, waits (bounded) until the
// proxy's /healthz answers 503, probes, and takes the taint off again
// (and waits for 200) before it returns. A proxy that never notices shows
// it in its cells: the wait ends, the cells are probed all the same.
func (w *World) Drained(ctx context.Context, cells []Cell) map[string]Outcome {
	out := map[string]Outcome{}
	healthz := Cell{Shape: cells[0].Shape, Frontend: FHealthz, Position: "node", Family: "v4"}
	wait := func(want string) {
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) && ctx.Err() == nil && w.Probe(ctx, healthz).String() != want {
			time.Sleep(200 * time.Millisecond)
		}
	}
	if err := w.taint(ctx, true); err != nil {
		for _, c := range cells {
			out[c.Key()] = Outcome{Failures: []string{"harness: " + err.Error()}}
		}
		return out
	}
	wait("http 503")
	for _, c := range cells {
		out[c.Key()] = w.Probe(ctx, c)
	}
	if err := w.taint(ctx, false); err != nil {
		for _, c := range cells {
			out[c.Key()] = Outcome{Failures: []string{"harness: " + err.Error()}}
		}
		return out
	}
	wait("http 200")
	return out
}

// taint puts the toBeDeleted taint on this node's Node object (on) or
// takes it off, retrying on a conflict (bounded).
func (w *World) taint(ctx context.Context, on bool) error {
	var last error
	err := cluster.WaitFor(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
		n, err := w.Client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			last = err
			return false, nil
		}
		n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == toBeDeleted })
		if on {
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: toBeDeleted, Value: "1", Effect: corev1.TaintEffectNoSchedule})
		}
		if _, err := w.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			last = err
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("taint node %s %s (on: %t): %v: %w", NodeName, toBeDeleted, on, last, err)
	}
	return nil
}
