//go:build cpuprofile

package main

import (
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"time"
)

// A build with -tags cpuprofile (never shipped) profiles the CPU from the
// process's start for $EP_CPUPROFILE_SECONDS (default 5) and writes
// $EP_CPUPROFILE-<pid>.prof (default /tmp/edgeproxy-cpu-…): where a cold
// start's time goes in a real world, e.g. epbench's S1, which an
// in-process benchmark of the datapath alone does not show.
//
//	go build -tags cpuprofile -o /tmp/edgeproxy-prof ./agent/cmd/edgeproxy
//	go tool pprof -top /tmp/edgeproxy-prof /tmp/edgeproxy-cpu-<pid>.prof
func init() {
	prefix := os.Getenv("EP_CPUPROFILE")
	if prefix == "" {
		prefix = "/tmp/edgeproxy-cpu"
	}
	secs, err := strconv.ParseFloat(os.Getenv("EP_CPUPROFILE_SECONDS"), 64)
	if err != nil || secs <= 0 {
		secs = 5
	}
	f, err := os.Create(fmt.Sprintf("%s-%d.prof", prefix, os.Getpid()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "cpuprofile:", err)
		return
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		fmt.Fprintln(os.Stderr, "cpuprofile:", err)
		f.Close()
		return
	}
	time.AfterFunc(time.Duration(secs*float64(time.Second)), func() {
		pprof.StopCPUProfile()
		f.Close()
	})
}
