package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Report is a whole run: what ran where, and every result.
type Report struct {
	Date       time.Time    `json:"date"`
	Machine    Machine      `json:"machine"`
	Plan       Plan         `json:"plan"`
	Binaries   []Binary     `json:"binaries"`
	Results    []Result     `json:"results"`
	Link       []LinkResult `json:"link,omitempty"`
	Took       float64      `json:"tookSeconds"`
	Command    string       `json:"command"`
	Resolution string       `json:"-"`
}

// Machine describes where the numbers come from.
type Machine struct {
	CPU      string  `json:"cpu"`
	Cores    int     `json:"cores"`
	MemoryGB float64 `json:"memoryGiB"`
	Kernel   string  `json:"kernel"`
	OS       string  `json:"os"`
	IPTables string  `json:"iptables"`
}

// Binary is a program under test and its size.
type Binary struct {
	Name     string `json:"name"`
	Version  string `json:"version"`
	Size     int64  `json:"sizeBytes"`
	Stripped int64  `json:"strippedBytes"`
}

// WriteFiles writes report.md, results.json and the charts into dir.
func (rep *Report) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), js, 0o644); err != nil {
		return err
	}
	charts, err := rep.Charts(dir)
	if err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "report.md"))
	if err != nil {
		return err
	}
	defer f.Close()
	rep.Markdown(f, charts)
	return f.Close()
}

func find(rs []Result, kind ProxyKind, backend string, n int) *Result {
	for i := range rs {
		if rs[i].Scenario == "" && rs[i].Proxy == kind && rs[i].Backend == backend && rs[i].Services == n {
			return &rs[i]
		}
	}
	return nil
}

func secs(v float64) string {
	switch {
	case math.IsNaN(v) || v < 0:
		return "–"
	case v < 1:
		return fmt.Sprintf("%.1f ms", v*1000)
	default:
		return fmt.Sprintf("%.2f s", v)
	}
}

func mib(v float64) string {
	if v <= 0 || math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.1f MiB", v/(1<<20))
}

func ratio(a, b float64) string {
	if a <= 0 || b <= 0 || math.IsNaN(a) || math.IsNaN(b) {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

// verdict says whether value met target (value <= target), and by how much not.
func verdict(value, target float64) string {
	if math.IsNaN(value) || math.IsNaN(target) || target <= 0 || value <= 0 {
		return "–"
	}
	if value <= target {
		return "met"
	}
	return fmt.Sprintf("missed by %.0f%%", 100*(value/target-1))
}

// verdictUse is verdict for a use of a resource, where none is a value:
// using none meets any target, using some misses a target of none.
func verdictUse(value, target float64) string {
	switch {
	case math.IsNaN(value) || math.IsNaN(target) || value < 0 || target < 0:
		return "–"
	case value == 0 || value <= target:
		return "met"
	case target == 0:
		return "missed (none allowed)"
	}
	return verdict(value, target)
}

// Markdown writes the report.
func (rep *Report) Markdown(w io.Writer, charts []string) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format+"\n", a...) }
	p("# edgeproxy vs kube-proxy — benchmark report")
	p("")
	p("- Date: %s; the run took %s.", rep.Date.UTC().Format("2006-01-02 15:04 MST"), (time.Duration(rep.Took) * time.Second).String())
	p("- Machine: %s, %d cores, %.0f GiB; %s; kernel %s; %s.", rep.Machine.CPU, rep.Machine.Cores, rep.Machine.MemoryGB, rep.Machine.OS, rep.Machine.Kernel, rep.Machine.IPTables)
	for _, b := range rep.Binaries {
		p("- %s %s: %s (%s stripped).", b.Name, b.Version, mib(float64(b.Size)), mib(float64(b.Stripped)))
	}
	s := rep.Plan.Settings
	p("- Settings, the same for every proxy: iptables mode (kube-proxy-nftables: nftables mode, on the nft backend only); minimum sync period %s; sync period %s; cluster CIDR %s (masquerade of ClusterIP traffic from outside it); %d endpoints per service; services %v; backends %v.",
		s.MinSync, s.Sync, s.ClusterCIDR, rep.Plan.Endpoints, rep.Plan.Sizes, rep.Plan.Backends)
	p("- Command: `%s`", rep.Command)
	p("")
	p("How it is measured: a real kube-apiserver with etcd; Services without selectors and one EndpointSlice each, written by the driver with `%s` stamped; one proxy at a time in an emptied node network namespace; \"visible\" means the kernel's nat table holds the DNAT destination (read with IPT_SO_GET_ENTRIES for x_tables; for nf_tables, from the rules, sets and map elements it announces on its event group for every committed transaction: xtables-compat DNAT targets, native `dnat` expressions and the data of `dnat … map` elements). The floor is one `iptables-restore` of the rule set that proxy wrote, into an empty namespace (S1; shown also with `--noflush`, which a proxy that shares the tables must use), and one single-chain `iptables-restore --noflush` on top of it (S2); for kube-proxy-nftables, `nft -f` of its tables and of one added chain. CPU includes children (iptables-restore, nft). Watch resolution is the median cost of one read of the x_tables table. Details: test/bench/README.md.", triggerAnnotation)
	p("")
	rep.linkSection(p)
	rep.s0Section(p)
	for _, backend := range rep.Plan.Backends {
		if !slices.ContainsFunc(rep.Results, func(r Result) bool { return r.Backend == backend && r.Scenario == "" }) {
			continue // L only, or S0 only
		}
		p("## Backend: iptables-%s", backend)
		p("")
		rep.s1Table(p, backend, KubeProxy)
		rep.s1Table(p, backend, KubeProxyNFT)
		rep.nftablesSection(p, backend)
		p("### S2 one change (API write → kernel-visible), %d flips", rep.Plan.Flips)
		p("")
		p("The API server's share is from the write until it handed the slice to the bench's own watch; the proxy's share is the rest of each flip.")
		p("")
		p("| services | proxy | p50 | p99 | API server's share p50 / p99 | proxy's share p50 / p99 | proxy's own metric p50 / p99 | floor (one chain) | watch resolution | target p50 ≤ floor+10ms | target p99 ≤ 2×p50 |")
		p("|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
		for _, n := range rep.Plan.Sizes {
			for _, kind := range rep.Plan.Proxies {
				r := find(rep.Results, kind, backend, n)
				if r == nil || len(r.Flips) == 0 {
					continue
				}
				p50, p99 := quantile(r.Flips, 0.5), quantile(r.Flips, 0.99)
				tgt1, tgt2 := "", ""
				if !kind.upstream() {
					tgt1, tgt2 = verdict(p50, r.FloorOneChange+0.010), verdict(p99, 2*p50)
				}
				res := secs(r.WatchResolution)
				if backend == "nft" {
					res = "events"
				}
				api, own := "", ""
				if d, pr := r.flipShares(); len(d) > 0 {
					api = secs(quantile(d, 0.5)) + " / " + secs(quantile(d, 0.99))
					own = secs(quantile(pr, 0.5)) + " / " + secs(quantile(pr, 0.99))
				}
				p("| %d | %s | %s | %s | %s | %s | %s / %s | %s | %s | %s | %s |", n, kind, secs(p50), secs(p99), api, own, secs(r.FlipMetricP50), secs(r.FlipMetricP99),
					secs(r.FloorOneChange), res, tgt1, tgt2)
			}
		}
		p("")
		p("### S3 churn (rolling update)")
		p("")
		p("| services | proxy | updates/s | updates | p50 | p99 | syncs | CPU per change | backlog drained after the last write |")
		p("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
		for _, r := range rep.Results {
			if r.Backend != backend {
				continue
			}
			for _, c := range r.Churn {
				p("| %d | %s | %d | %d | %s | %s | %.0f | %s | %s |", r.Services, r.Proxy, c.Rate, c.Updates, secs(c.P50), secs(c.P99), c.Syncs, secs(c.CPUPerChange), secs(c.Drain))
			}
		}
		p("")
		p("### S4 quiet resync and S5 footprint")
		p("")
		p("CPU in the quiet window is the time on CPU of the proxy's threads (schedstat, in nanoseconds) plus its children's; the harness scrapes `/metrics` before and after the window, not in it.")
		p("")
		ref := rep.strongest(backend)
		p("| services | proxy | quiet window | CPU in it | syncs | kernel writes | steady RSS | Go heap | goroutines | target: 0 writes | target CPU ≤ %s | target RSS ≤%s× %s |", ref, rep.rssTargets(ref), ref)
		p("|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|")
		for _, n := range rep.Plan.Sizes {
			k := find(rep.Results, ref, backend, n)
			for _, kind := range rep.Plan.Proxies {
				r := find(rep.Results, kind, backend, n)
				if r == nil || r.QuietWindow == 0 {
					continue
				}
				writes := fmt.Sprint(r.KernelWrites)
				if r.KernelWrites < 0 {
					writes = "n/a"
				}
				t1, t2, t3 := "", "", ""
				if !kind.upstream() {
					switch {
					case r.KernelWrites == 0:
						t1 = "met"
					case r.KernelWrites > 0:
						t1 = fmt.Sprintf("missed (%d)", r.KernelWrites)
					}
					if k != nil {
						t2 = verdictUse(r.QuietCPU, k.QuietCPU)
						t3 = verdict(float64(r.SteadyRSS), rssRatio(kind, ref)*float64(k.SteadyRSS))
					}
				}
				p("| %d | %s | %s | %s | %.0f | %s | %s | %s | %.0f | %s | %s | %s |", n, kind, secs(r.QuietWindow), secs(r.QuietCPU), r.QuietSyncs, writes,
					mib(float64(r.SteadyRSS)), mib(r.HeapAlloc), r.Goroutines, t1, t2, t3)
			}
		}
		p("")
		if slices.Contains(rep.Plan.Proxies, EdgeProxyWasm) {
			p("### S6 policy cost (a one-module Wasm chain, `topology`, on every service)")
			p("")
			p("| services | S1 without | S1 with | S1 over | S2 p50 without | S2 p50 with | S2 over | target ≤10%% |")
			p("|---:|---:|---:|---:|---:|---:|---:|---|")
			for _, n := range rep.Plan.Sizes {
				e, x := find(rep.Results, EdgeProxy, backend, n), find(rep.Results, EdgeProxyWasm, backend, n)
				if e == nil || x == nil {
					continue
				}
				a, b := quantile(e.Flips, 0.5), quantile(x.Flips, 0.5)
				t := "met"
				if x.ColdStart > 1.1*e.ColdStart || b > 1.1*a {
					t = "missed"
				}
				p("| %d | %s | %s | %s | %s | %s | %s | %s |", n, secs(e.ColdStart), secs(x.ColdStart), over(x.ColdStart, e.ColdStart), secs(a), secs(b), over(b, a), t)
			}
			p("")
		}
	}
	var failed []string
	for _, r := range rep.Results {
		if r.Error != "" {
			failed = append(failed, fmt.Sprintf("- %s, %s, %d services: %s", r.Proxy, r.Backend, r.Services, r.Error))
		}
	}
	if len(failed) > 0 {
		p("## Runs that failed")
		p("")
		p("%s", strings.Join(failed, "\n"))
		p("")
	}
	if len(charts) > 0 {
		p("## Charts")
		p("")
		for _, c := range charts {
			p("![%s](%s)", strings.TrimSuffix(c, ".png"), c)
			p("")
		}
	}
}

func over(with, without float64) string {
	if with <= 0 || without <= 0 || math.IsNaN(with) || math.IsNaN(without) {
		return "–"
	}
	return fmt.Sprintf("%+.0f%%", 100*(with/without-1))
}

// upstream: kube-proxy, in either mode (the reference, not under target).
func (kind ProxyKind) upstream() bool { return kind == KubeProxy || kind == KubeProxyNFT }

// strongest is the kube-proxy the targets compare with on backend: its
// nftables mode where it ran, else its iptables mode.
func (rep *Report) strongest(backend string) ProxyKind {
	for _, r := range rep.Results {
		if r.Proxy == KubeProxyNFT && r.Backend == backend && r.Error == "" {
			return KubeProxyNFT
		}
	}
	return KubeProxy
}

// rssRatio is S5's target for kind against ref: issue 27's 0.4× for
// nftables mode against kube-proxy's, 0.5× otherwise.
func rssRatio(kind, ref ProxyKind) float64 {
	if kind == EdgeProxyNFT && ref == KubeProxyNFT {
		return nftRSSRatio
	}
	return 0.5
}

// rssTargets names the S5 targets of the edgeproxy rows against ref:
// "0.4", "0.5", or both ("0.5 (edgeproxy-nftables 0.4)").
func (rep *Report) rssTargets(ref ProxyKind) string {
	var nft, other bool
	for _, kind := range rep.Plan.Proxies {
		switch {
		case kind.upstream():
		case rssRatio(kind, ref) == nftRSSRatio:
			nft = true
		default:
			other = true
		}
	}
	switch {
	case nft && other:
		return fmt.Sprintf("0.5 (%s %g)", EdgeProxyNFT, nftRSSRatio)
	case nft:
		return fmt.Sprint(nftRSSRatio)
	}
	return "0.5"
}

// floorTarget is the S1 target against the one-restore floor.
const floorTarget = 1.5

// s1Table is S1 of edgeproxy against one kube-proxy (skipped where that
// one did not run).
func (rep *Report) s1Table(p func(string, ...any), backend string, ref ProxyKind) {
	var rows []string
	for _, n := range rep.Plan.Sizes {
		k, e := find(rep.Results, ref, backend, n), find(rep.Results, EdgeProxy, backend, n)
		if k == nil || e == nil {
			continue
		}
		rows = append(rows, fmt.Sprintf("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |", n, secs(k.ColdStart), secs(e.ColdStart), ratio(e.ColdStart, k.ColdStart),
			secs(e.FloorRestore), ratio(e.ColdStart, e.FloorRestore), secs(e.FloorNoflush), mib(float64(k.ColdPeakRSS)), mib(float64(e.ColdPeakRSS)),
			secs(k.ColdCPU), secs(e.ColdCPU), verdict(e.ColdStart, 0.5*k.ColdStart), verdict(e.ColdStart, floorTarget*e.FloorRestore)))
	}
	if len(rows) == 0 {
		return
	}
	p("### S1 cold start (process start → every endpoint in the kernel), against %s", ref)
	p("")
	p("| services | %[1]s | edgeproxy | ratio | floor (edgeproxy's rules) | edgeproxy / floor | the floor with --noflush | %[1]s peak RSS | edgeproxy peak RSS | CPU %[1]s | CPU edgeproxy | target ≤0.5× %[1]s | target ≤%[2]g× floor |", ref, floorTarget)
	p("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
	for _, r := range rows {
		p("%s", r)
	}
	p("")
}

// s0Section is the edge-scale quiet window, every backend and proxy.
func (rep *Report) s0Section(p func(string, ...any)) {
	var rows []Result
	for _, r := range rep.Results {
		if r.Scenario == "S0" {
			rows = append(rows, r)
		}
	}
	if len(rows) == 0 {
		return
	}
	p("## S0 edge scale: %d services × %d endpoints, quiet", rows[0].Services, rows[0].Endpoints)
	p("")
	p("After the cold start has settled, nothing changes for the window. RSS is the process plus live children (median of one sample per second; the peak beside it); CPU is the time on CPU of the proxy's threads (`/proc/PID/task/*/schedstat`, in nanoseconds) plus its children's; wakeups are voluntary context switches summed over the proxy's threads (`/proc/PID/task/*/status`).")
	p("")
	p("| backend | proxy | window | steady RSS | peak RSS | CPU per minute | wakeups per second | Go heap | goroutines | cold start | target RSS ≤25 MiB | target CPU ≤50 ms/min |")
	p("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
	for _, r := range rows {
		if r.Idle == nil {
			p("| %s | %s | failed: %s |  |  |  |  |  |  |  |  |  |", r.Backend, r.Proxy, r.Error)
			continue
		}
		t1, t2 := "", ""
		if !r.Proxy.upstream() {
			t1, t2 = verdict(float64(r.SteadyRSS), 25<<20), verdictUse(r.Idle.CPUPerMinute, 0.050)
		}
		p("| %s | %s | %s | %s | %s | %s | %.1f | %s | %.0f | %s | %s | %s |", r.Backend, r.Proxy, secs(r.Idle.Window), mib(float64(r.SteadyRSS)), mib(float64(r.Idle.PeakRSS)),
			secs(r.Idle.CPUPerMinute), r.Idle.WakeupsPerS, mib(r.HeapAlloc), r.Goroutines, secs(r.ColdStart), t1, t2)
	}
	p("")
}

// The targets of edgeproxy's nftables mode (issue 27).
const (
	nftS1Ratio   = 0.25 // of kube-proxy nftables' cold start
	nftS1Floor   = 1.3  // of the native floor
	nftRSSRatio  = 0.4  // of kube-proxy nftables' steady RSS
	nftS0RSS     = 15 << 20
	nftS2P50Big  = 0.050 // above 5,000 Services
	nftS2P50     = 0.030 // up to 5,000
	nftS2BigFrom = 5000
)

// nftablesSection is edgeproxy-nftables against kube-proxy-nftables and
// edgeproxy on iptables-nft, with issue 27's targets, and what one change
// writes to nf_tables per proxy.
func (rep *Report) nftablesSection(p func(string, ...any), backend string) {
	var rows []string
	for _, n := range rep.Plan.Sizes {
		e, k, i := find(rep.Results, EdgeProxyNFT, backend, n), find(rep.Results, KubeProxyNFT, backend, n), find(rep.Results, EdgeProxy, backend, n)
		if e == nil || e.Error != "" {
			continue
		}
		val := func(r *Result, f func(*Result) float64) float64 {
			if r == nil || r.Error != "" {
				return math.NaN()
			}
			return f(r)
		}
		s1 := func(r *Result) float64 { return r.ColdStart }
		p50 := func(r *Result) float64 { return quantile(r.Flips, 0.5) }
		rss := func(r *Result) float64 { return float64(r.SteadyRSS) }
		quiet := func(r *Result) float64 { return r.QuietCPU }
		ep50, ep99 := quantile(e.Flips, 0.5), quantile(e.Flips, 0.99)
		p50Target := nftS2P50
		if n > nftS2BigFrom {
			p50Target = nftS2P50Big
		}
		kS1, kRSS := val(k, s1), val(k, rss)
		rows = append(rows, fmt.Sprintf("| %d | %s | %s (%s) %s | %s (%s) %s | %s | %s / %s: %s, p99 %s | %s | %s | %s (%s) %s | %s vs %s: %s |", n,
			secs(e.ColdStart),
			secs(kS1), ratio(e.ColdStart, kS1), verdict(e.ColdStart, nftS1Ratio*kS1),
			secs(e.FloorRestore), ratio(e.ColdStart, e.FloorRestore), verdict(e.ColdStart, nftS1Floor*e.FloorRestore),
			secs(val(i, s1)),
			secs(ep50), secs(ep99), verdict(ep50, p50Target), verdict(ep99, 2*ep50),
			secs(val(k, p50)), secs(val(i, p50)),
			mib(float64(e.SteadyRSS)), ratio(float64(e.SteadyRSS), kRSS), verdict(float64(e.SteadyRSS), nftRSSRatio*kRSS),
			secs(e.QuietCPU), secs(val(k, quiet)), verdictUse(e.QuietCPU, val(k, quiet))))
	}
	if len(rows) == 0 {
		return
	}
	p("### edgeproxy `mode: nftables` (issue 27 targets)")
	p("")
	p("The native floor is edgeproxy-nftables' own tables, read back over netlink and written into an empty namespace as one netlink batch (one sendmsg, until the kernel acknowledges the commit), with the bench's reader of nf_tables events subscribed there as it is in every proxy's run (the kernel builds an event of every object it commits for each listener); the median of three such batches, each into a namespace of its own. S2 targets: p50 ≤ %s up to %d Services, ≤ %s above; p99 ≤ 2× p50.", secs(nftS2P50), nftS2BigFrom, secs(nftS2P50Big))
	p("")
	p("| services | S1 edgeproxy-nftables | S1 kube-proxy-nftables (ratio) target ≤%g× | native floor (ratio) target ≤%g× | S1 edgeproxy iptables-nft | S2 p50 / p99 | S2 p50 kube-proxy-nftables | S2 p50 edgeproxy iptables-nft | steady RSS (against kube-proxy-nftables) target ≤%g× | S4 quiet CPU vs kube-proxy-nftables |", nftS1Ratio, nftS1Floor, nftRSSRatio)
	p("|---:|---:|---|---|---:|---|---:|---:|---|---|")
	for _, r := range rows {
		p("%s", r)
	}
	p("")
	for _, r := range rep.Results {
		if r.Scenario == "S0" && r.Proxy == EdgeProxyNFT && r.Backend == backend && r.Error == "" {
			p("S0 (%d services × %d endpoints): edgeproxy-nftables steady RSS %s, target ≤ %s: %s.", r.Services, r.Endpoints, mib(float64(r.SteadyRSS)), mib(nftS0RSS), verdict(float64(r.SteadyRSS), nftS0RSS))
			p("")
		}
	}
	p("#### What one change writes to nf_tables")
	p("")
	p("Per S2 flip, the transactions committed from the API write until the new endpoint was visible, as the kernel announces them on its event group (one message per object added or removed, echoing it: close to, not exactly, the bytes a proxy sent). Medians over the flips.")
	p("")
	p("| services | proxy | transactions | messages | bytes |")
	p("|---:|---|---:|---:|---:|")
	for _, n := range rep.Plan.Sizes {
		for _, kind := range rep.Plan.Proxies {
			r := find(rep.Results, kind, backend, n)
			if r == nil || len(r.FlipWrites) == 0 {
				continue
			}
			var t, m, b []float64
			for _, w := range r.FlipWrites {
				t, m, b = append(t, float64(w.Transactions)), append(m, float64(w.Messages)), append(b, float64(w.Bytes))
			}
			p("| %d | %s | %.0f | %.0f | %.0f |", n, kind, quantile(t, 0.5), quantile(m, 0.5), quantile(b, 0.5))
		}
	}
	p("")
}

// flipShares splits each S2 flip into the API server's share (write to the
// bench's watch: FlipDelivered itself, which callers only read) and the
// proxy's (the rest, at least 0). Empty when the run did not record
// deliveries.
func (r *Result) flipShares() (api, proxy []float64) {
	if len(r.FlipDelivered) != len(r.Flips) {
		return nil, nil
	}
	proxy = make([]float64, len(r.Flips))
	for i, d := range r.FlipDelivered {
		proxy[i] = max(0, r.Flips[i]-d)
	}
	return r.FlipDelivered, proxy
}
