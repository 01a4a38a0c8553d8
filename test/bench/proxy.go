package bench

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/edgeproxy/edgeproxy/test/proxies"
)

// Settings are what both proxies are given, the same for both.
type Settings = proxies.Settings

// ProxyKind names a proxy under test.
type ProxyKind string

const (
	KubeProxy     ProxyKind = "kube-proxy"
	EdgeProxy     ProxyKind = "edgeproxy"
	EdgeProxyWasm ProxyKind = "edgeproxy+wasm" // a one-module chain on every service
	// KubeProxyNFT is kube-proxy in nftables mode. It does not use the
	// iptables backend, so it runs on the nft backend only, next to
	// edgeproxy on iptables-nft (both program nf_tables).
	KubeProxyNFT ProxyKind = ProxyKind(proxies.KubeProxyNFTables)
	// EdgeProxyNFT is edgeproxy in `mode: nftables`: its own tables over
	// netlink, no iptables program. Like kube-proxy-nftables it runs on
	// the nft backend only, next to edgeproxy on iptables-nft.
	EdgeProxyNFT ProxyKind = "edgeproxy-nftables"
)

// Runs reports whether kind is run on backend.
func (kind ProxyKind) Runs(backend string) bool { return !kind.nftables() || backend == "nft" }

// nftables: the proxy programs nf_tables itself, in tables of its own.
func (kind ProxyKind) nftables() bool { return kind == KubeProxyNFT || kind == EdgeProxyNFT }

// Binaries are the programs under test.
type Binaries struct {
	EdgeProxy string
	KubeProxy string
	Module    string // the Wasm module of the EdgeProxyWasm chain (topology)
}

// Proxy is a running proxy in the node namespace.
type Proxy struct {
	*proxies.Process // PID, Exited, Stop, Log
	Kind             ProxyKind
	Metrics          string // the /metrics URL, reachable from the host
	Started          time.Time
}

// Start starts a proxy of the given kind, alone, in the node namespace.
func (w *World) Start(kind ProxyKind, bins Binaries, s Settings, dir string) (*Proxy, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	path, err := proxies.BackendPath(w.Dir, s.Backend)
	if err != nil {
		return nil, err
	}
	node := proxies.Node{Name: NodeName, Kubeconfig: w.Kubeconfig,
		MetricsAddr: w.NodeIP.String() + ":10249", HealthzAddr: w.NodeIP.String() + ":10256"}
	var cmd *exec.Cmd
	switch kind {
	case KubeProxy:
		cmd = w.Node.Command(bins.KubeProxy, proxies.KubeProxyArgs(node, s)...)
	case KubeProxyNFT:
		cmd = w.Node.Command(bins.KubeProxy, proxies.KubeProxyNFTablesArgs(node, s)...)
	case EdgeProxy, EdgeProxyWasm, EdgeProxyNFT:
		if kind == EdgeProxyNFT {
			s.Mode = "nftables"
		}
		cfg := proxies.EdgeProxyConfig(node, s, filepath.Join(dir, "state"))
		if kind == EdgeProxyWasm {
			cfg += fmt.Sprintf(`policy:
  modules:
    - name: topology
      path: %s
  chains:
    - name: every-service
      modules:
        - module: topology
`, bins.Module)
		}
		conf := filepath.Join(dir, "edgeproxy.yaml")
		if err := os.WriteFile(conf, []byte(cfg), 0o600); err != nil {
			return nil, err
		}
		if kind == EdgeProxyWasm {
			if err := warmCompileCache(bins.EdgeProxy, strings.Replace(cfg, "kubeconfig: "+w.Kubeconfig+"\n", "", 1), dir); err != nil {
				return nil, err
			}
		}
		cmd = w.Node.Command(bins.EdgeProxy, "run", "--config", conf)
	default:
		return nil, fmt.Errorf("bench: unknown proxy %q", kind)
	}
	logPath := filepath.Join(dir, string(kind)+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = proxies.Env(path)
	p := &Proxy{Kind: kind, Metrics: "http://" + node.MetricsAddr + "/metrics"}
	p.Started = time.Now()
	if p.Process, err = proxies.Start(string(kind), cmd, logPath); err != nil {
		return nil, err
	}
	return p, nil
}

// Usage is a process's resource use read from /proc.
type Usage struct {
	CPU time.Duration // user+system of the process and its waited-for children
	// Run is CPU to the nanosecond for quiet windows, where /proc/PID/stat's
	// clock ticks (10 ms) are as large as what is measured: the time on CPU
	// of the process's live threads (schedstat), plus its children as CPU
	// counts them. A thread that exits takes its time with it; the Go
	// proxies measured keep their threads.
	Run   time.Duration
	RSS   int64 // bytes, the process plus its live children
	Peak  int64 // VmHWM of the process, bytes
	Count int   // live children
}

const clockTick = 100 // USER_HZ on Linux

// ReadUsage reads /proc for pid and its live children.
func ReadUsage(pid int) (Usage, error) {
	var u Usage
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return u, err
	}
	f := statFields(string(st))
	if len(f) < 17 {
		return u, fmt.Errorf("bench: short /proc/%d/stat", pid)
	}
	ticks := atoi(f[13]) + atoi(f[14]) + atoi(f[15]) + atoi(f[16])
	u.CPU = time.Duration(ticks) * time.Second / clockTick
	u.Run = threadsRun(pid) + time.Duration(atoi(f[15])+atoi(f[16]))*time.Second/clockTick
	u.RSS, u.Peak = statusMem(pid)
	// Live children (an iptables-restore in flight): their RSS and CPU so far.
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		c, err := strconv.Atoi(e.Name())
		if err != nil || c == pid {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c))
		if err != nil {
			continue
		}
		cf := statFields(string(b))
		if len(cf) < 17 || atoi(cf[3]) != int64(pid) {
			continue
		}
		u.Count++
		child := time.Duration(atoi(cf[13])+atoi(cf[14])) * time.Second / clockTick
		u.CPU += child
		u.Run += child
		rss, _ := statusMem(c)
		u.RSS += rss
	}
	return u, nil
}

// threadsRun sums the time on CPU of pid's live threads: the first field
// of /proc/PID/task/TID/schedstat, in nanoseconds.
func threadsRun(pid int) time.Duration {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, _ := os.ReadDir(dir)
	var run time.Duration
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "schedstat"))
		if err != nil {
			continue
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			run += time.Duration(atoi(f[0]))
		}
	}
	return run
}

// statFields splits /proc/pid/stat after the command name (which may hold
// spaces); index 0 is the pid, as in proc(5) numbering minus one.
func statFields(s string) []string {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	head := strings.Fields(s[:strings.IndexByte(s, '(')])
	return append(append(head, "comm"), strings.Fields(s[i+1:])...)
}

func atoi(s string) int64 { v, _ := strconv.ParseInt(s, 10, 64); return v }

func statusMem(pid int) (rss, hwm int64) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		kb := atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB")) * 1024
		switch k {
		case "VmRSS":
			rss = kb
		case "VmHWM":
			hwm = kb
		}
	}
	return rss, hwm
}

// Sampler samples a process's usage every interval until stopped, keeping
// the peak RSS (process plus children).
type Sampler struct {
	stop chan struct{}
	done chan struct{}
	Peak int64
	Last Usage
}

// Sample starts sampling pid.
func Sample(pid int, every time.Duration) *Sampler {
	s := &Sampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if u, err := ReadUsage(pid); err == nil {
				s.Last = u
				s.Peak = max(s.Peak, u.RSS, u.Peak)
			}
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// Stop ends sampling and returns the peak RSS in bytes.
func (s *Sampler) Stop() int64 {
	close(s.stop)
	<-s.done
	return s.Peak
}

// Scrape reads the proxy's metrics.
func (p *Proxy) Scrape(ctx context.Context) (proxies.Metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.Metrics, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("bench: %s: %s", p.Metrics, resp.Status)
	}
	return proxies.ParseMetrics(resp.Body)
}

// warmCompileCache compiles the chain's module into the state directory's
// cache with `edgeproxy plan` on no services, as any earlier start on the
// node would have: the measured start is a restart, not the one-off first
// compile (which the policy benchmarks measure). No snapshot is written.
func warmCompileCache(bin, cfg, dir string) error {
	empty := filepath.Join(dir, "no-manifests")
	if err := os.MkdirAll(empty, 0o700); err != nil {
		return err
	}
	conf := filepath.Join(dir, "warm.yaml")
	if err := os.WriteFile(conf, []byte(cfg), 0o600); err != nil {
		return err
	}
	cmd := exec.Command(bin, "plan", "--config", conf, "--manifests", empty)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("bench: warm the compile cache: %v: %s", err, out)
	}
	return nil
}
