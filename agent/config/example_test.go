package config_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/prometheus/client_golang/prometheus"
)

func ExampleLoad() {
	dir, _ := os.MkdirTemp("", "edgeproxy-example")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "edgeproxy.yaml")
	_ = os.WriteFile(path, []byte("mode: ipvs\nsync:\n  period: 1m\n"), 0o644)

	cfg, err := config.Load(config.LoadOptions{
		File:  path,
		Env:   []string{"EDGEPROXY_SYNC_MINPERIOD=2s"},  // normally os.Environ()
		Flags: map[string]string{"node-name": "edge-1"}, // only the flags the user set
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(cfg.NodeName, cfg.Mode, cfg.Sync.MinPeriod, cfg.Sync.Period, cfg.Policy.MemoryLimit)

	_, err = config.Load(config.LoadOptions{Flags: map[string]string{"mode": "foo", "sync.minPeriod": "abc"}})
	fmt.Println(err)
	// Output:
	// edge-1 ipvs 2s 1m0s 16Mi
	// config: sync.minPeriod: "abc" is not a duration
	// config: mode: "foo" is not one of iptables, ipvs, nftables, plan
}

func ExampleWatcher() {
	dir, _ := os.MkdirTemp("", "edgeproxy-example")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "edgeproxy.yaml")
	_ = os.WriteFile(path, []byte("log:\n  level: info\n"), 0o644)

	opts := config.LoadOptions{File: path} // the agent also sets Env: os.Environ() and Flags
	cfg, err := config.Load(opts)
	if err != nil {
		fmt.Println(err)
		return
	}
	var level slog.LevelVar
	level.Set(cfg.Log.SlogLevel())
	w, err := config.NewWatcher(cfg, config.WatcherOptions{
		Load:       opts,
		Registerer: prometheus.NewRegistry(),
		OnChange: func(prev, next *config.Config) error {
			level.Set(next.Log.SlogLevel()) // hand each stage its new settings
			return nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Run(ctx) }() // watches until ctx is done

	_ = os.WriteFile(path, []byte("log:\n  level: debug\n"), 0o644)
	_ = w.Reload() // what a file event (or SIGHUP) does
	fmt.Println(w.Current().Log.Level, level.Level())

	cancel()
	fmt.Println(<-done)
	// Output:
	// debug DEBUG
	// <nil>
}
