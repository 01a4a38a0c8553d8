package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/edgeproxy/edgeproxy/agent"
	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/agent/model"
	"github.com/edgeproxy/edgeproxy/agent/planner"
	"github.com/edgeproxy/edgeproxy/agent/policychain"
	"github.com/edgeproxy/edgeproxy/datapath"
	"github.com/edgeproxy/edgeproxy/datapath/nftables"
)

func printPlan(w io.Writer, a *agent.Agent, format string) error {
	res := a.Last()
	if res == nil {
		return errors.New("plan: no plan computed")
	}
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Generation uint64                                      `json:"generation"`
			Frontends  []datapath.Frontend                         `json:"frontends"`
			Explain    map[model.ServicePortName][]planner.Explain `json:"explain"`
		}{res.Plan.Generation, res.Plan.Frontends, res.Explains(nil)})
	}
	_, err := io.WriteString(w, res.Plan.String())
	return err
}

// clientFlags are the flags of the commands that ask a running agent.
func clientFlags(name string) (*flag.FlagSet, *string, *string, *string) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	out := fs.String("o", "text", "")
	server := fs.String("server", "", "")
	cfgPath := fs.String("config", "", "")
	return fs, out, server, cfgPath
}

// debugGet fetches a debug endpoint of the local agent, whose address comes
// from --server, else from the config's server.metrics.
func debugGet(server, cfgPath, path string, query url.Values, v any) error {
	if server == "" {
		flags := map[string]string{}
		if cfgPath != "" {
			flags["config"] = cfgPath
		}
		quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
		cfg, err := config.Load(config.LoadOptions{Env: os.Environ(), Flags: flags, Logger: quiet})
		if err != nil {
			return err
		}
		server = cfg.Server.Metrics
	}
	if strings.Contains(server, "://") {
		// A URL given for HOST:PORT: take its host.
		if su, err := url.Parse(server); err == nil && su.Host != "" {
			server = su.Host
		}
	}
	if server == "" {
		return errors.New("the agent's metrics server is disabled (server.metrics is empty); pass --server HOST:PORT")
	}
	u := url.URL{Scheme: "http", Host: server, Path: path, RawQuery: query.Encode()}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return fmt.Errorf("--server %q: want HOST:PORT: %w", server, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach the agent at %s (is edgeproxy running? `systemctl status edgeproxy`): %w", server, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxReply+1))
	if err != nil {
		return fmt.Errorf("reading %s: %w", u.String(), err)
	}
	if len(body) > maxReply {
		return fmt.Errorf("%s: the reply is larger than %d MiB, more than any agent sends; not read", u.String(), maxReply>>20)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error string }
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			return errors.New(e.Error)
		}
		return fmt.Errorf("%s: %s", u.String(), resp.Status)
	}
	return json.Unmarshal(body, v)
}

// maxReply bounds what debugGet reads of a reply.
const maxReply = 64 << 20

// parseAnywhere parses flags given before, between or after the
// positional arguments (as kubectl does) and returns the positional ones;
// everything after "--" is positional.
func parseAnywhere(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// checkOutput refuses an -o the commands do not know.
func checkOutput(o string) error {
	if o != "text" && o != "json" {
		return usageError("-o %q: want text or json", o)
	}
	return nil
}

func runStatus(args []string, stdout io.Writer) error {
	fs, out, server, cfgPath := clientFlags("status")
	pos, err := parseAnywhere(fs, args)
	if err != nil {
		return usageError("%v", err)
	}
	if len(pos) > 0 {
		return usageError("status: unexpected argument %q", pos[0])
	}
	if err := checkOutput(*out); err != nil {
		return err
	}
	var st agent.Status
	if err := debugGet(*server, *cfgPath, "/debug/status", nil, &st); err != nil {
		return fmt.Errorf("status: %w", err)
	}
	// Every agent names its mode and node: a reply without them ({}, null)
	// is not from an agent, and printing it would show a healthy-looking
	// table of nothing (or an unhealthy agent that is not there).
	if st.Mode == "" || st.Node == "" {
		return errors.New("status: the reply is no agent status (it names no mode or node): is --server an edgeproxy agent?")
	}
	if *out == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	renderStatus(stdout, &st, time.Now())
	return nil
}

// renderStatus prints the status for people: the agent, its policy
// modules, what stands out, and every service's frontends.
func renderStatus(w io.Writer, st *agent.Status, now time.Time) {
	renderAgent(w, st, now)
	if len(st.Modules) > 0 {
		renderModules(w, st.Modules, now)
	}
	renderNotes(w, st)
	fmt.Fprintln(w)
	renderServices(w, st.Services)
}

// renderAgent prints who answers, its health and where its state comes
// from.
func renderAgent(w io.Writer, st *agent.Status, now time.Time) {
	age := func(t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return now.Sub(t).Round(time.Second).String() + " ago"
	}
	health := "healthy"
	if !st.Health.Healthy {
		health = "UNHEALTHY"
	}
	fmt.Fprintf(w, "edgeproxy %s  mode %s  node %s  source %s\n", st.Version, st.Mode, st.Node, st.Source)
	fmt.Fprintf(w, "health: %s  last sync: %s  plan generation: %d\n", health, age(st.Health.LastUpdated), st.Generation)
	if strings.HasPrefix(st.Source, "api") {
		reach := ""
		if !st.APIReachable {
			reach = " (not answering: rules kept as they are)"
		}
		fmt.Fprintf(w, "API server last contact: %s%s\n", age(st.Health.APIServerLastContact), reach)
		if l := st.Link; l != nil {
			fmt.Fprintf(w, "API link: %s in, %s out; %d full lists, %d watches\n", bytesIEC(l.BytesIn), bytesIEC(l.BytesOut), l.Lists, l.Watches)
		}
		fmt.Fprintf(w, "snapshot: written %s\n", age(st.SnapshotWritten))
	}
	if st.FromSnapshot {
		fmt.Fprintln(w, "serving the last known state from the snapshot until the API server is back")
	}
	if n := st.NFTables; n != nil {
		renderNFTables(w, n, age)
	}
}

// renderNFTables prints the nftables datapath's last apply and tables.
func renderNFTables(w io.Writer, n *nftables.Status, age func(time.Time) string) {
	if l := n.LastApply; !l.At.IsZero() {
		kind := "partial"
		if l.Rebuilt {
			kind = "tables rewritten"
		}
		fmt.Fprintf(w, "nftables: last apply %s: %s, %d service ports compared, %d netlink operations (%d bytes), %s\n",
			age(l.At), kind, l.Units, l.Messages, l.Bytes, l.Duration.Round(time.Microsecond))
	}
	var tables []string
	for _, t := range n.Tables {
		if t.Written {
			tables = append(tables, fmt.Sprintf("%s family: %d tables, %d chains, %d service ports", t.Family, t.Tables, t.Chains, t.ServicePorts))
		}
	}
	if len(tables) > 0 {
		fmt.Fprintf(w, "nftables tables: %s\n", strings.Join(tables, "; "))
	}
	for _, warn := range n.Warnings {
		fmt.Fprintf(w, "nftables warning: %s\n", warn)
	}
}

// renderModules prints the policy modules' table.
func renderModules(w io.Writer, modules []policychain.ModuleStatus, now time.Time) {
	fmt.Fprintln(w, "policy modules:")
	mw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(mw, "  CHAIN\tMODULE\tSTATE\tSHA256")
	for _, m := range modules {
		state := "ok"
		switch {
		case m.State.OpenUntil.After(now):
			state = fmt.Sprintf("circuit open (%d failures), retry in %s", m.State.Failures, m.State.OpenUntil.Sub(now).Round(time.Second))
		case m.State.Failures > 0:
			state = fmt.Sprintf("failing (%d in a row)", m.State.Failures)
		}
		if m.Skipped > 0 {
			state += fmt.Sprintf(", %d skipped (policy.shadowBudget spent)", m.Skipped)
		}
		sum := m.SHA256
		if len(sum) > 12 {
			sum = sum[:12]
		}
		name := m.Module
		if m.ShadowOf != "" {
			name += " (shadow of " + m.ShadowOf + ")"
		}
		fmt.Fprintf(mw, "  %s\t%s\t%s\t%s\n", m.Chain, name, state, sum)
	}
	mw.Flush()
}

// renderNotes prints what stands out, when it does: the last error,
// ignored externalIPs, kube-proxy's rules, what was left out or skipped.
func renderNotes(w io.Writer, st *agent.Status) {
	if st.Health.LastError != "" {
		fmt.Fprintf(w, "last error: %s\n", st.Health.LastError)
	}
	if len(st.ExternalIPsIgnored) > 0 {
		fmt.Fprintf(w, "externalIPs not programmed (externalIPs: false): %s\n", strings.Join(st.ExternalIPsIgnored, ", "))
	}
	if kp := st.KubeProxy; kp != nil {
		switch {
		case len(kp.Returned) > 0:
			fmt.Fprintf(w, "kube-proxy still runs: it wrote its rules again (%s)\n", kp.Returned)
		case len(kp.Removed) > 0:
			fmt.Fprintf(w, "kube-proxy's rules removed %s: %s\n", kp.RemovedAt.Format(time.RFC3339), kp.Removed)
		case kp.Kept && len(kp.Found) > 0:
			fmt.Fprintf(w, "kube-proxy's rules kept (keepKubeProxy): %s\n", kp.Found)
		}
	}
	if len(st.Refused) > 0 {
		fmt.Fprintln(w, "left out of the datapath (everything else is programmed):")
		for _, r := range st.Refused {
			fmt.Fprintf(w, "  %s\n", r)
		}
	}
	if len(st.Skipped) > 0 {
		fmt.Fprintln(w, "inputs skipped (whole, or the parts named):")
		for _, p := range st.Skipped {
			fmt.Fprintf(w, "  %s %s: %s\n", p.Kind, p.Object, p.Reason)
		}
	}
}

// renderServices prints one line per frontend with its weighted
// endpoints.
func renderServices(w io.Writer, services []agent.ServiceView) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tFRONTEND\tKIND\tENDPOINTS (weight)")
	for _, s := range services {
		for _, f := range s.Frontends {
			var eps []string
			for _, e := range f.Endpoints {
				eps = append(eps, fmt.Sprintf("%s (%d)", e.Addr, e.Weight))
			}
			if len(eps) == 0 {
				eps = []string{"none"}
			}
			fmt.Fprintf(tw, "%s\t%s/%s\t%s\t%s\n", s.Service, f.AddrString(), strings.ToLower(string(f.Protocol)), f.Kind, strings.Join(eps, ", "))
		}
	}
	tw.Flush()
}

func runExplain(args []string, stdout io.Writer) error {
	fs, out, server, cfgPath := clientFlags("explain")
	pos, err := parseAnywhere(fs, args)
	if err != nil {
		return usageError("%v", err)
	}
	if len(pos) != 1 || strings.Count(pos[0], "/") != 1 {
		return usageError("explain needs one NAMESPACE/NAME")
	}
	if err := checkOutput(*out); err != nil {
		return err
	}
	var ex map[model.ServicePortName][]planner.Explain
	if err := debugGet(*server, *cfgPath, "/debug/explain", url.Values{"service": {pos[0]}}, &ex); err != nil {
		return fmt.Errorf("explain: %w", err)
	}
	// The agent answers 404 for a service it has no port of, so an empty
	// reply ({}, null) is not from an agent.
	if len(ex) == 0 {
		return errors.New("explain: the reply names no service port: is --server an edgeproxy agent?")
	}
	if *out == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(ex)
	}
	renderExplain(stdout, ex)
	return nil
}

// renderExplain prints, per service port and family, the built-in verdict
// of every endpoint, the policy's word and the frontends programmed.
func renderExplain(w io.Writer, ex map[model.ServicePortName][]planner.Explain) {
	ports := slices.SortedFunc(maps.Keys(ex), model.ServicePortName.Compare)
	for _, p := range ports {
		for _, e := range ex[p] {
			fmt.Fprintf(w, "%s (IPv%d)\n", p, e.Family)
			if e.Topology != "" {
				fmt.Fprintf(w, "  topology: %s\n", e.Topology)
			}
			for _, n := range e.Notes {
				fmt.Fprintf(w, "  note: %s\n", n)
			}
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "  ENDPOINT\tNODE\tZONE\tTRAFFIC\tBUILT-IN\tWEIGHT")
			row := func(d planner.Decision, traffic string, chosen bool) {
				weight := "-"
				if chosen {
					weight = fmt.Sprint(e.Weights[d.Endpoint])
				}
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", d.Endpoint, dash(d.Node), dash(d.Zone), traffic, d.Reason, weight)
			}
			for _, d := range e.Internal {
				row(d, "internal", true)
			}
			for _, d := range e.External {
				row(d, "external", true)
			}
			for _, d := range e.Skipped {
				row(d, "skipped ("+d.Traffic+")", false)
			}
			tw.Flush()
			if e.Policy != nil {
				b, _ := json.Marshal(e.Policy)
				fmt.Fprintf(w, "  policy: %s\n", b)
				renderShadows(w, b)
			}
			fmt.Fprintln(w, "  programmed:")
			for _, f := range e.Frontends {
				fmt.Fprintf(w, "    %s\n", f)
			}
		}
	}
}

// renderShadows prints a line per shadow module of the policy verdict
// (its JSON, b): what it answered and how that differs from the module it
// shadows. Nothing when there are none.
func renderShadows(w io.Writer, b []byte) {
	var v policychain.Verdict
	if json.Unmarshal(b, &v) != nil {
		return
	}
	for _, s := range v.Shadows {
		fmt.Fprintf(w, "  shadow %s (of %s, never programmed): %s\n", s.Module, s.Of, s.Summary())
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func runCleanup(args []string, stderr io.Writer) error {
	f := newAgentFlags("cleanup")
	if err := f.parse(args); err != nil {
		return err
	}
	cfg, _, err := f.load(slog.New(slog.NewTextHandler(stderr, nil)))
	if err != nil {
		return err
	}
	// The configured log level and format, as `run` logs.
	log := newLogger(stderr, cfg, new(slog.LevelVar))
	ctx, stop := signalContext()
	defer stop()
	return agent.Cleanup(ctx, cfg, log)
}

func runModule(args []string, stdout io.Writer) error {
	if len(args) < 1 || args[0] != "check" {
		return usageError("module: want `module check FILE`")
	}
	return moduleCheck(args[1:], stdout)
}

// bytesIEC writes n bytes in B, KiB, MiB or GiB, to a tenth.
func bytesIEC(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	v, unit := float64(n)/1024, "KiB"
	for _, u := range []string{"MiB", "GiB"} {
		if v < 1024 {
			break
		}
		v, unit = v/1024, u
	}
	return fmt.Sprintf("%.1f %s", v, unit)
}
