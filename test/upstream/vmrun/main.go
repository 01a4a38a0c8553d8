// Command vmrun runs test/upstream/run.sh inside the qemu VM of
// internal/testkit/vm, whose Debian kernel has IPVS (this machine's has
// not): run.sh calls it for EPUP_MODE=ipvs once everything is built on
// the host. The guest sees the host's root read-only, so the binaries and
// images of build.sh and test/cluster/build.sh are there as built; the
// directory -dir (run.sh's $EPUP_OUT) is shared writable, and run.sh in
// the guest copies each proxy's JUnit and logs into it.
//
//	go -C test run ./upstream/vmrun -dir OUT -mem 6144 -cpus 2 -timeout 4h -- ARGS...
//
// ARGS are run.sh's own (smoke or suite). The environment variables named
// by -pass are handed to the guest (where set), and EPUP_IN_VM=1 with
// them. The guest's output is printed as it goes (from the shared
// directory) and at the end; the exit status is run.sh's in the guest.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/edgeproxy/edgeproxy/internal/testkit/vm"
)

func main() {
	dir := flag.String("dir", "", "the directory shared writable with the guest (run.sh's $EPUP_OUT)")
	mem := flag.Int("mem", 6144, "the guest's memory, MiB")
	cpus := flag.Int("cpus", 0, "the guest's vCPUs (0: the accelerator's default)")
	timeout := flag.Duration("timeout", 4*time.Hour, "bounds the whole run, boot included")
	pass := flag.String("pass", "PROXIES,EPUP_MODE,EPUP_NODE_COUNT,EPUP_FOCUS,EPUP_SKIP,EPUP_NODES,EPUP_EXTERNAL_IPS,EPUP_IPTABLES,EPUP_SWITCH_SECONDS,K8S_BIN,UPSTREAM",
		"comma-separated environment variables handed to the guest")
	flag.Parse()
	if err := run(*dir, *mem, *cpus, *timeout, strings.Split(*pass, ","), flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "vmrun:", err)
		os.Exit(1)
	}
}

func run(dir string, mem, cpus int, timeout time.Duration, pass, args []string) error {
	if dir == "" || len(args) == 0 {
		return fmt.Errorf("usage: vmrun -dir OUT [-mem MiB] [-cpus N] [-timeout D] -- smoke|suite")
	}
	if err := vm.Check(); err != nil {
		return err
	}
	root, err := vm.RepoRoot()
	if err != nil {
		return err
	}
	env := []string{"EPUP_OUT=" + dir}
	for _, k := range pass {
		if v, ok := os.LookupEnv(k); ok && k != "" {
			env = append(env, k+"="+v)
		}
	}
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	script := fmt.Sprintf("exec sh %s %s\n", filepath.Join(root, "test/upstream/run.sh"), strings.Join(quoted, " "))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	done, followed := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(followed)
		follow(filepath.Join(dir, ".vm", "output"), done)
	}()
	res, err := vm.Run(ctx, vm.Options{
		Dir:       dir,
		Script:    script,
		Env:       env,
		HostPaths: []string{root},
		// overlay: containerd's snapshotter, on the guest's tmpfs.
		Modules:  append(append([]string(nil), vm.DefaultModules...), "overlay"),
		Timeout:  timeout,
		MemoryMB: mem,
		CPUs:     cpus,
	})
	close(done)
	<-followed
	if res != nil {
		fmt.Fprintf(os.Stderr, "vmrun: accel %s; waited %s for another VM, booted in %s, ran %s\n",
			res.Accel, res.Waited.Round(time.Second), res.Boot.Round(time.Second), res.Elapsed.Round(time.Second))
	}
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("run.sh in the guest exited %d", res.ExitCode)
	}
	return nil
}

// follow copies what the guest appends to path to stderr, every 2 s,
// until done is closed (and once more then).
func follow(path string, done <-chan struct{}) {
	var off int64
	copyNew := func() {
		f, err := os.Open(path)
		if err != nil {
			return
		}
		defer f.Close()
		if st, err := f.Stat(); err != nil || st.Size() < off {
			off = 0
		}
		if _, err := f.Seek(off, 0); err != nil {
			return
		}
		buf := make([]byte, 64<<10)
		for {
			n, err := f.Read(buf)
			os.Stderr.Write(buf[:n])
			off += int64(n)
			if err != nil {
				return
			}
		}
	}
	for {
		select {
		case <-done:
			copyNew()
			return
		case <-time.After(2 * time.Second):
			copyNew()
		}
	}
}
