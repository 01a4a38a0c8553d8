// Command edgeproxy is a kube-proxy replacement for edge nodes. See
// README.md for the commands and ARCHITECTURE.md for how it works.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/klog/v2"

	"github.com/edgeproxy/edgeproxy/agent"
	"github.com/edgeproxy/edgeproxy/agent/config"
)

// version is set by the build (-ldflags "-X main.version=...").
var version = "dev"

const usage = `edgeproxy — a kube-proxy replacement for edge nodes

Usage:
  edgeproxy [run] [flags]            run the proxy
  edgeproxy plan [flags] [-o text|json]
                                     list, compute the plan once, print it, exit
  edgeproxy status [-o text|json]    what the running agent programmed
  edgeproxy explain NAMESPACE/NAME   why each endpoint of a service got its weight
  edgeproxy cleanup [flags]          remove every kernel object edgeproxy created
  edgeproxy module check FILE        check a policy module without loading it
  edgeproxy version [-o text|json]   version, commit, Go version, policy ABI versions
  edgeproxy completion bash|zsh|fish shell completion script

Flags of run, plan and cleanup:
  --config FILE  --kubeconfig FILE | --manifests DIR  --node-name NAME  --mode iptables|ipvs|plan
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches a command line and returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	cmd := "run"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "run":
		err = runAgent(args, stderr)
	case "plan":
		err = runPlan(args, stdout, stderr)
	case "status":
		err = runStatus(args, stdout)
	case "explain":
		err = runExplain(args, stdout)
	case "cleanup":
		err = runCleanup(args, stderr)
	case "module":
		err = runModule(args, stdout)
	case "version":
		err = runVersion(args, stdout)
	case "completion":
		err = runCompletion(args, stdout)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
	default:
		err = usageError("unknown command %q", cmd)
	}
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "edgeproxy:", err)
	var ue usageErr
	if errors.As(err, &ue) {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var ce exitCode
	if errors.As(err, &ce) {
		return int(ce)
	}
	return 1
}

type usageErr struct{ msg string }

func (e usageErr) Error() string { return e.msg }

func usageError(format string, a ...any) error { return usageErr{fmt.Sprintf(format, a...)} }

// exitCode is an error that carries a specific exit status.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// agentFlags are the flags shared by run, plan and cleanup.
type agentFlags struct {
	fs  *flag.FlagSet
	set map[string]*string
}

func newAgentFlags(name string) *agentFlags {
	f := &agentFlags{fs: flag.NewFlagSet(name, flag.ContinueOnError), set: map[string]*string{}}
	f.fs.SetOutput(io.Discard)
	for _, n := range []string{"config", "kubeconfig", "manifests", "node-name", "mode"} {
		f.set[n] = f.fs.String(n, "", "")
	}
	return f
}

func (f *agentFlags) parse(args []string) error {
	pos, err := parseAnywhere(f.fs, args)
	if err != nil {
		return usageError("%v", err)
	}
	if len(pos) > 0 {
		return usageError("unexpected argument %q", pos[0])
	}
	return nil
}

// load reads the config with only the flags the user set.
func (f *agentFlags) load(log *slog.Logger) (*config.Config, config.LoadOptions, error) {
	flags := map[string]string{}
	f.fs.Visit(func(fl *flag.Flag) {
		if _, ok := f.set[fl.Name]; ok { // not -o, --timeout: those are the command's own
			flags[fl.Name] = fl.Value.String()
		}
	})
	opts := config.LoadOptions{Env: os.Environ(), Flags: flags, Logger: log}
	cfg, err := config.Load(opts)
	return cfg, opts, err
}

// newLogger builds the process logger and routes client-go's klog into it.
func newLogger(w io.Writer, cfg *config.Config, level *slog.LevelVar) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(cfg.Log.Level)); err == nil {
		level.Set(l)
	}
	hopts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(w, hopts)
	if cfg.Log.Format == "json" {
		h = slog.NewJSONHandler(w, hopts)
	}
	log := slog.New(h)
	klog.SetSlogLogger(log.With("component", "client-go"))
	return log
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

func runAgent(args []string, stderr io.Writer) error {
	f := newAgentFlags("run")
	if err := f.parse(args); err != nil {
		return err
	}
	boot := slog.New(slog.NewTextHandler(stderr, nil))
	cfg, lopts, err := f.load(boot)
	if err != nil {
		return err
	}
	level := new(slog.LevelVar)
	log := newLogger(stderr, cfg, level)
	lopts.Logger = log
	// The Go runtime's and the process's own metrics (heap, goroutines,
	// RSS, CPU), as kube-proxy exposes them.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a, err := agent.New(agent.Options{Config: cfg, Load: lopts, Logger: log, LogLevel: level, Version: version, Registry: reg})
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	log.Info("edgeproxy starting", "version", version, "mode", cfg.Mode, "node", cfg.NodeName)
	err = a.Run(ctx)
	log.Info("edgeproxy stopped; kernel rules stay in place")
	return err
}

func runPlan(args []string, stdout, stderr io.Writer) error {
	f := newAgentFlags("plan")
	out := f.fs.String("o", "text", "")
	timeout := f.fs.Duration("timeout", 60*time.Second, "")
	if err := f.parse(args); err != nil {
		return err
	}
	if err := checkOutput(*out); err != nil {
		return err
	}
	if *timeout <= 0 {
		return usageError("--timeout %s: must be positive", *timeout)
	}
	boot := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg, _, err := f.load(boot)
	if err != nil {
		return err
	}
	// One-shot: compute, touch nothing, serve nothing.
	cfg.Mode = config.ModePlan
	cfg.Server = config.Server{}
	level := new(slog.LevelVar)
	level.Set(slog.LevelWarn)
	if cfg.Log.Level == "debug" {
		level.Set(slog.LevelDebug)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	klog.SetSlogLogger(log.With("component", "client-go"))
	a, err := agent.New(agent.Options{Config: cfg, Logger: log, Version: version})
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	select {
	case <-a.Synced():
	case err := <-done:
		if err == nil {
			err = ctx.Err()
		}
		return fmt.Errorf("plan: no plan computed: %w", err)
	case <-ctx.Done():
		return fmt.Errorf("plan: source did not sync within %s", *timeout)
	}
	cancel()
	<-done
	return printPlan(stdout, a, *out)
}
