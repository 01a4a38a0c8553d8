//go:build heapprofile

package main

import (
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"syscall"
)

// A build with -tags heapprofile (never shipped) writes a heap profile on
// SIGUSR2, after a GC, to $EP_HEAPPROFILE-<pid>-<n>.prof (default
// /tmp/edgeproxy-heap-…), and the runtime's memory statistics to stderr:
// where the steady heap goes in a real world, e.g. epbench's
// (test/bench/RESULTS.md, "Where the steady heap goes"). It samples one
// allocation in 4 KiB, not 512: finer, at some cost in memory.
//
//	go build -tags heapprofile -o /tmp/edgeproxy-prof ./agent/cmd/edgeproxy
//	kill -USR2 <pid>; go tool pprof -top -inuse_space /tmp/edgeproxy-prof /tmp/edgeproxy-heap-<pid>-0.prof
func init() {
	runtime.MemProfileRate = 4096
	prefix := os.Getenv("EP_HEAPPROFILE")
	if prefix == "" {
		prefix = "/tmp/edgeproxy-heap"
	}
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGUSR2)
	go func() {
		for n := 0; ; n++ {
			<-c
			runtime.GC()
			name := fmt.Sprintf("%s-%d-%d.prof", prefix, os.Getpid(), n)
			f, err := os.Create(name)
			if err != nil {
				continue
			}
			pprof.Lookup("heap").WriteTo(f, 0)
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			fmt.Fprintf(os.Stderr, "heapprofile %s: HeapAlloc %d HeapInuse %d HeapIdle %d HeapReleased %d StackInuse %d Sys %d GCSys %d OtherSys %d MSpanInuse %d NumGC %d\n",
				name, m.HeapAlloc, m.HeapInuse, m.HeapIdle, m.HeapReleased, m.StackInuse, m.Sys, m.GCSys, m.OtherSys, m.MSpanInuse, m.NumGC)
			f.Close()
		}
	}()
}
