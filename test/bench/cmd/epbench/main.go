// Command epbench runs edgeproxy and upstream kube-proxy, one at a time,
// against a real kube-apiserver and writes a side-by-side report: cold
// start, one-change latency, churn, quiet resync, footprint and the cost of
// a Wasm policy chain (see test/bench/README.md).
//
//	epbench -size quick -out bench-out      # about twenty minutes
//	epbench -size full -out bench-out       # the committed RESULTS.md
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/edgeproxy/edgeproxy/test/bench"
	"github.com/edgeproxy/edgeproxy/test/cluster"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "epbench:", err)
		os.Exit(1)
	}
}

func run() error {
	size := flag.String("size", "quick", "quick (1k services, about 10 minutes), full (1k, 5k and 10k), or a list of service counts such as 1000,5000")
	backends := flag.String("backends", "legacy,nft", "iptables backends to run, in order")
	proxies := flag.String("proxies", "kube-proxy,kube-proxy-nftables,edgeproxy,edgeproxy+wasm,edgeproxy-nftables", "proxies to run, in order (kube-proxy-nftables and edgeproxy-nftables run on the nft backend only)")
	s0 := flag.Bool("s0", true, "run S0 first: 100 services × 3 endpoints and a quiet window, for every backend and proxy")
	s0Window := flag.Duration("s0-window", 0, "the S0 quiet window (default: 5m full, 1m otherwise)")
	flips := flag.Int("flips", 0, "S2 single-endpoint flips per run (default: 30 quick, 100 full)")
	endpoints := flag.Int("endpoints", 10, "endpoints per service")
	churnRates := flag.String("churn-rates", "20,50", "S3 slice updates per second")
	churnFor := flag.Duration("churn-for", 0, "S3 length at each rate (default: 15s quick, 60s full)")
	churnSize := flag.Int("churn-size", 0, "S3 runs at this service count only (default: 5000 when run, else the largest)")
	minSync := flag.Duration("min-sync", time.Second, "minimum sync period of both proxies")
	syncPeriod := flag.Duration("sync", 10*time.Second, "sync period of both proxies")
	nftMax := flag.Int("nft-max", 0, "largest service count run on the nft backend (default: 5000 for full, else no limit); kube-proxy's iptables mode takes minutes per sync on iptables-nft 1.8.9 beyond")
	out := flag.String("out", "bench-out", "directory for report.md, results.json, the charts and the logs")
	edge := flag.String("edgeproxy", "bin/edgeproxy", "edgeproxy binary")
	kp := flag.String("kube-proxy", "", "kube-proxy binary (default: the one test/cluster/build.sh built)")
	module := flag.String("module", "bin/modules/topology.wasm", "Wasm module of the edgeproxy+wasm chain")
	link := flag.Bool("link", true, "run L first: the bytes on the node's link at a cold start and through an outage, kube-proxy and edgeproxy")
	linkOnly := flag.Bool("link-only", false, "run L only")
	linkServices := flag.Int("link-services", 1000, "L: services (plus a tenth as many headless and a tenth for another proxy)")
	linkOutage := flag.Duration("link-outage", time.Minute, "L: the blackhole")
	linkAdded := flag.Int("link-added", 0, "L: services added during the outage (default: 1% of -link-services)")
	linkProxies := flag.String("link-proxies", "kube-proxy,edgeproxy", "L: proxies to run, in order")
	linkGone := flag.Bool("link-gone", false, "L: take the outage beyond the API server's watch cache (objects no proxy is sent change until the resourceVersions at the drop are gone, from 80 s in)")
	linkQuiet := flag.Duration("link-quiet", 0, "L: a window after the cold start with no change, to measure a quiet node's link (0: none)")
	linkReboot := flag.Bool("link-reboot", false, "L: reboot the proxy during the outage (killed, tables flushed, started again with its state directory)")
	linkRate := flag.String("link-rate", "", "L: shape the node's link both ways to this tc rate (tbf), e.g. 64kbit")
	linkTimeout := flag.Duration("link-timeout", 0, "L: cap of a proxy's wait for its endpoints, at the cold start and after the outage (default 15m)")
	flag.Parse()

	if os.Geteuid() != 0 {
		return errors.New("must run as root (network namespaces and iptables)")
	}
	plan := bench.Plan{NFTMax: *nftMax, Endpoints: *endpoints, ChurnSize: *churnSize, ChurnFor: *churnFor, Flips: *flips,
		Settings: bench.Settings{MinSync: *minSync, Sync: *syncPeriod, ClusterCIDR: "10.244.0.0/16"},
		Timeout:  15 * time.Minute, S0Window: *s0Window}
	if plan.S0Window == 0 {
		plan.S0Window = time.Minute
		if *size == "full" {
			plan.S0Window = 5 * time.Minute
		}
	}
	if !*s0 {
		plan.S0Window = 0
	}
	switch *size {
	case "quick":
		plan.Sizes = []int{1000}
		plan.Flips = or(plan.Flips, 30)
		plan.ChurnFor = orD(plan.ChurnFor, 15*time.Second)
	case "full":
		plan.Sizes = []int{1000, 5000, 10000}
		plan.Flips = or(plan.Flips, 100)
		plan.ChurnFor = orD(plan.ChurnFor, 60*time.Second)
		plan.ChurnSize = or(plan.ChurnSize, 5000)
		plan.NFTMax = or(*nftMax, 5000)
	default:
		for _, s := range strings.Split(*size, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || n < 1 {
				return fmt.Errorf("-size %q: want quick, full or service counts like 1000,5000", *size)
			}
			plan.Sizes = append(plan.Sizes, n)
		}
		plan.Flips = or(plan.Flips, 40)
		plan.ChurnFor = orD(plan.ChurnFor, 20*time.Second)
	}
	for _, s := range strings.Split(*churnRates, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("-churn-rates %q: want numbers like 20,50", *churnRates)
		}
		plan.ChurnRates = append(plan.ChurnRates, n)
	}
	plan.Backends = strings.Split(*backends, ",")
	if *link || *linkOnly {
		lp := &bench.LinkPlan{Services: *linkServices, Endpoints: *endpoints, Headless: *linkServices / 10, OtherProxy: *linkServices / 10,
			Outage: *linkOutage, Added: or(*linkAdded, max(1, *linkServices/100)), Backend: "legacy",
			Gone: *linkGone, Reboot: *linkReboot, Quiet: *linkQuiet, Rate: *linkRate, Timeout: *linkTimeout}
		for _, p := range strings.Split(*linkProxies, ",") {
			lp.Proxies = append(lp.Proxies, bench.ProxyKind(p))
		}
		plan.Link, plan.LinkOnly = lp, *linkOnly
	}
	for _, p := range strings.Split(*proxies, ",") {
		plan.Proxies = append(plan.Proxies, bench.ProxyKind(p))
	}

	bins := bench.Binaries{EdgeProxy: abs(*edge), KubeProxy: *kp, Module: abs(*module)}
	if bins.KubeProxy == "" {
		p, err := cluster.BinPath("kube-proxy")
		if err != nil {
			return err
		}
		bins.KubeProxy = p
	}
	need := []string{bins.EdgeProxy, bins.KubeProxy}
	if !*linkOnly && strings.Contains(*proxies, string(bench.EdgeProxyWasm)) {
		need = append(need, bins.Module)
	}
	for _, b := range need {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("%w (make build modules cluster-bins)", err)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	dir, err := filepath.Abs(*out)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	start := time.Now()
	w, err := bench.NewWorldWith(ctx, dir, cluster.Options{Audit: plan.Link != nil})
	if err != nil {
		return err
	}
	defer w.Close()
	r := &bench.Runner{World: w, Bins: bins, Plan: plan, Dir: dir, Log: log}
	results, runErr := r.Run(ctx)
	rep := &bench.Report{Date: start, Machine: machine(), Plan: plan, Results: results, Link: r.LinkResults,
		Took: time.Since(start).Seconds(), Command: "epbench " + strings.Join(os.Args[1:], " "),
		Binaries: []bench.Binary{binary("edgeproxy", bins.EdgeProxy, "version"), binary("kube-proxy", bins.KubeProxy, "--version")}}
	if err := rep.WriteFiles(dir); err != nil {
		return err
	}
	log.Info("report written", "path", filepath.Join(dir, "report.md"), "took", time.Since(start).Round(time.Second))
	return runErr
}

func or(v, d int) int {
	if v == 0 {
		return d
	}
	return v
}

func orD(v, d time.Duration) time.Duration {
	if v == 0 {
		return d
	}
	return v
}

func abs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return a
}

func machine() bench.Machine {
	m := bench.Machine{Cores: runtime.NumCPU()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb float64
		fmt.Sscanf(strings.SplitN(string(b), "\n", 2)[0], "MemTotal: %f kB", &kb)
		m.MemoryGB = kb / (1 << 20)
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "PRETTY_NAME="); ok {
				m.OS = strings.Trim(v, `"`)
			}
		}
	}
	if o, err := exec.Command("iptables-legacy", "--version").Output(); err == nil {
		m.IPTables = strings.TrimSpace(strings.TrimSuffix(string(o), "(legacy)\n"))
	}
	return m
}

// binary reports a program's version and size, and its size stripped of
// symbols and debug information (a copy is stripped, not the original).
func binary(name, path, versionArg string) bench.Binary {
	b := bench.Binary{Name: name}
	if o, err := exec.Command(path, versionArg).Output(); err == nil {
		b.Version = strings.TrimSpace(strings.SplitN(string(o), "\n", 2)[0])
	}
	if fi, err := os.Stat(path); err == nil {
		b.Size = fi.Size()
	}
	tmp, err := os.CreateTemp("", "epbench-strip-*")
	if err != nil {
		return b
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	if err := exec.Command("strip", "-o", tmp.Name(), path).Run(); err == nil {
		if fi, err := os.Stat(tmp.Name()); err == nil {
			b.Stripped = fi.Size()
		}
	}
	return b
}
