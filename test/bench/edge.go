package bench

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// S0 is the edge-scale scenario: a small cluster (100 services × 3
// endpoints by default) and a long quiet window, for what an edge box pays
// every minute for a proxy that has nothing to do: memory, CPU and
// wakeups.

// Idle is what S0 measures over its window.
type Idle struct {
	Window       float64 `json:"windowSeconds"`
	CPU          float64 `json:"cpuSeconds"`          // process and children over the window
	CPUPerMinute float64 `json:"cpuSecondsPerMinute"` // the same, per minute
	Wakeups      int64   `json:"wakeups"`             // voluntary context switches of the proxy's threads
	WakeupsPerS  float64 `json:"wakeupsPerSecond"`
	PeakRSS      int64   `json:"peakRSSBytes"` // the largest sample, process plus live children
	// Trace is a sample per second: seconds into the window, CPU seconds
	// and wakeups since its start, RSS.
	Trace []IdleSample `json:"trace"`
}

// IdleSample is one point of an S0 window.
type IdleSample struct {
	T       float64 `json:"t"`
	CPU     float64 `json:"cpuSeconds"`
	Wakeups int64   `json:"wakeups"`
	RSS     int64   `json:"rssBytes"`
}

// edge runs S0 for every backend and proxy, in its own namespace, then
// deletes what it wrote so the sized runs start from nothing.
func (r *Runner) edge(ctx context.Context) ([]Result, error) {
	services, endpoints := cmp.Or(r.Plan.S0Services, 100), cmp.Or(r.Plan.S0Endpoints, 3)
	drv, err := NewDriver(r.World.Cluster.RESTConfig(), "bench-s0", endpoints)
	if err != nil {
		return nil, err
	}
	if err := drv.Grow(ctx, services); err != nil {
		return nil, err
	}
	var out []Result
	for _, backend := range r.Plan.Backends {
		for _, kind := range r.Plan.Proxies {
			if !kind.Runs(backend) {
				continue
			}
			res := Result{Scenario: "S0", Proxy: kind, Backend: backend, Services: services, Endpoints: endpoints}
			if err := r.idle(ctx, drv, &res); err != nil {
				if ctx.Err() != nil {
					return out, err
				}
				res.Error = err.Error()
				r.Log.Error("S0 failed", "proxy", kind, "backend", backend, "err", err)
			}
			out = append(out, res)
		}
	}
	return out, drv.Clear(ctx)
}

func (r *Runner) idle(ctx context.Context, drv *Driver, res *Result) error {
	log := r.Log.With("scenario", "S0", "proxy", res.Proxy, "backend", res.Backend, "services", res.Services)
	x, err := r.coldStart(ctx, log, res, drv.Expected(), "s0")
	defer x.close()
	if err != nil {
		return err
	}
	pid := x.p.PID()
	window := r.Plan.S0Window
	every := min(time.Second, max(window/60, 100*time.Millisecond))
	idle := &Idle{}
	at := func() (IdleSample, error) {
		u, err := ReadUsage(pid)
		if err != nil {
			return IdleSample{}, fmt.Errorf("bench: S0: %w", err)
		}
		wk, err := Wakeups(pid)
		if err != nil {
			return IdleSample{}, fmt.Errorf("bench: S0: %w", err)
		}
		return IdleSample{CPU: u.Run.Seconds(), Wakeups: wk, RSS: u.RSS}, nil
	}
	s0, err := at()
	if err != nil {
		return err
	}
	start := time.Now()
	var rss []int64
	tick := time.NewTicker(every)
	defer tick.Stop()
	for time.Since(start) < window {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		if err := x.p.Exited(); err != nil {
			return err
		}
		s, err := at()
		if err != nil {
			return err
		}
		s.T, s.CPU, s.Wakeups = time.Since(start).Seconds(), s.CPU-s0.CPU, s.Wakeups-s0.Wakeups
		idle.Trace = append(idle.Trace, s)
		rss = append(rss, s.RSS)
	}
	if len(idle.Trace) == 0 {
		return fmt.Errorf("bench: S0: no sample in a %s window", window)
	}
	last := idle.Trace[len(idle.Trace)-1]
	idle.Window, idle.CPU, idle.Wakeups = last.T, last.CPU, last.Wakeups
	idle.CPUPerMinute = idle.CPU * 60 / idle.Window
	idle.WakeupsPerS = float64(idle.Wakeups) / idle.Window
	slices.Sort(rss)
	res.SteadyRSS, idle.PeakRSS = rss[len(rss)/2], rss[len(rss)-1]
	if m, err := x.p.Scrape(ctx); err == nil {
		res.HeapAlloc, res.Goroutines = m.Sum("go_memstats_heap_alloc_bytes"), m.Sum("go_goroutines")
	}
	res.Idle = idle
	log.Info("S0 quiet", "window", idle.Window, "rss", res.SteadyRSS, "cpuPerMinute", idle.CPUPerMinute, "wakeupsPerSecond", idle.WakeupsPerS)
	return x.p.Exited()
}

// Wakeups is the sum of voluntary context switches over pid's threads
// (/proc/PID/task/*/status): how often the process went to sleep and was
// woken. Threads that ended take their count with them.
func Wakeups(pid int) (int64, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil {
		return 0, err
	}
	if len(tasks) == 0 {
		return 0, fmt.Errorf("bench: no threads of %d", pid)
	}
	var n int64
	for _, t := range tasks {
		n += statusField(t, "voluntary_ctxt_switches")
	}
	return n, nil
}

// statusField reads one number from a /proc status file (0 if absent).
func statusField(path, key string) int64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && k == key {
			return atoi(strings.TrimSpace(v))
		}
	}
	return 0
}
